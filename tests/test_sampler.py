"""Sampler against naive references: greedy is argmax, filtered sampling stays in the allowed set,
and the empirical distribution matches softmax(logits / T)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from minisgl.layers.logits_processor import LogitsProcessorOutput
from minisgl.layers.sampler import Sampler
from minisgl.sampling.sampling_batch_info import SamplingBatchInfo
from minisgl.sampling.sampling_params import SamplingParams


def sample(logits, params, seed=0):
    batch = SimpleNamespace(reqs=[SimpleNamespace(sampling_params=p) for p in params], device=torch.device("cpu"))
    info = SamplingBatchInfo.from_schedule_batch(batch, logits.shape[-1])
    generator = torch.Generator().manual_seed(seed)
    return Sampler()(LogitsProcessorOutput(next_token_logits=logits), info, generator)


def allowed_tokens(logits_row, p: SamplingParams) -> set:
    """Naive reference: walk the tokens by descending probability and apply top-k, top-p, min-p."""
    probs = torch.softmax(logits_row / p.temperature, -1).tolist()
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    kept, mass = set(), 0.0
    for rank, i in enumerate(order):
        if rank >= p.top_k or mass > p.top_p + 1e-6 or probs[i] < p.min_p * probs[order[0]] - 1e-9:
            break
        kept.add(i)
        mass += probs[i]
    return kept


def test_greedy_is_argmax():
    logits = torch.randn(16, 100, generator=torch.Generator().manual_seed(1))
    ids = sample(logits, [SamplingParams(temperature=0)] * 16)
    assert torch.equal(ids, logits.argmax(-1))


def test_filters_never_pick_outside_allowed_set():
    gen = torch.Generator().manual_seed(2)
    configs = [
        SamplingParams(temperature=1.0, top_k=3),
        SamplingParams(temperature=0.7, top_p=0.5),
        SamplingParams(temperature=1.3, min_p=0.2),
        SamplingParams(temperature=1.0, top_k=5, top_p=0.8, min_p=0.05),
        SamplingParams(temperature=0),  # greedy row inside a sampled batch: top_k=1
    ]
    for trial in range(50):
        logits = torch.randn(len(configs), 32, generator=gen) * 3
        ids = sample(logits, configs, seed=trial)
        for row, (p, token) in enumerate(zip(configs, ids.tolist())):
            assert token in allowed_tokens(logits[row], p), (trial, row)
    assert sample(logits, configs)[-1] == logits[-1].argmax()


def test_empirical_distribution_matches_softmax():
    """20,000 draws of one 8-token distribution; every frequency lies within 5 standard errors of p."""
    n, temperature = 20_000, 0.8
    logits_row = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    ids = sample(logits_row.repeat(n, 1), [SamplingParams(temperature=temperature)] * n, seed=3)
    freq = torch.bincount(ids, minlength=8).double() / n
    p = torch.softmax(logits_row.double() / temperature, -1)
    for k in range(8):
        bound = 5 * math.sqrt(p[k] * (1 - p[k]) / n)
        assert abs(freq[k] - p[k]) <= bound, (k, float(freq[k]), float(p[k]))


def test_seed_reproduces_draws():
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(4))
    params = [SamplingParams(temperature=1.0, top_p=0.9)] * 64
    assert torch.equal(sample(logits, params, seed=7), sample(logits, params, seed=7))
    assert not torch.equal(sample(logits, params, seed=7), sample(logits, params, seed=8))
