"""Sampler: logits to next-token ids, greedy or with temperature, top-k, top-p and min-p per request.

Reproducible: every random draw comes from a ``torch.Generator`` seeded with ``--random-seed``, so the
same seed and batch give the same tokens, and every tensor-parallel rank (same seed, same all-gathered
logits) draws the same tokens without a broadcast. SGLang's sampler adds FlashInfer kernels, logprobs,
grammar masks and an optional cross-rank all-reduce of the ids.
"""

from __future__ import annotations

import torch
from torch import nn

from minisgl.layers.logits_processor import LogitsProcessorOutput
from minisgl.sampling.sampling_batch_info import SamplingBatchInfo


class Sampler(nn.Module):
    def forward(
        self, logits_output: LogitsProcessorOutput, sampling_info: SamplingBatchInfo, generator: torch.Generator
    ) -> torch.Tensor:
        logits = logits_output.next_token_logits
        if sampling_info.is_all_greedy:
            return torch.argmax(logits, dim=-1)
        probs = torch.softmax(logits / sampling_info.temperatures, dim=-1)
        if sampling_info.need_top_k_sampling or sampling_info.need_top_p_sampling or sampling_info.need_min_p_sampling:
            return top_k_top_p_min_p_sampling_from_probs_torch(
                probs, sampling_info.top_ks, sampling_info.top_ps, sampling_info.min_ps, generator
            )
        return torch.multinomial(probs, num_samples=1, generator=generator).view(-1)


def top_k_top_p_min_p_sampling_from_probs_torch(
    probs: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor, min_ps: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """Zero out, in sorted order, tokens past top-k, past the top-p mass and below min_p * max, then draw."""
    probs_sort, probs_idx = probs.sort(dim=-1, descending=True)
    rank = torch.arange(probs.shape[-1], device=probs.device)
    mass_before = probs_sort.cumsum(dim=-1) - probs_sort
    keep = (rank[None, :] < top_ks[:, None]) & (mass_before <= top_ps[:, None])
    keep &= probs_sort >= probs_sort[:, :1] * min_ps[:, None]
    sampled = torch.multinomial(probs_sort * keep, num_samples=1, generator=generator)
    return probs_idx.gather(1, sampled).view(-1)
