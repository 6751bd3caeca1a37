"""DecodeCudaGraphRunner: decodes replayed from captured graphs give HF's greedy tokens.

On CUDA (``MINISGL_TEST_DEVICE=cuda``, bench/cuda.sh) the graphs are real. On a CPU, which has no CUDA graphs, a
"capture" keeps the forward as a function that each "replay" calls again over the same static buffers, writing the
same output tensor: all but the recording itself (the padding up to a captured batch size and length, the static
inputs and metadata rewritten before each replay, the sliced output) runs as it does on a GPU.
"""

from __future__ import annotations

import types

import pytest
import torch

from minisgl.bench_one_batch import decode, extend
from minisgl.model_executor.runner.decode_cuda_graph_runner import (
    DecodeCudaGraphRunner,
    generate_decode_cuda_graph_batch_sizes,
    get_seq_lens_to_capture,
    uses_cuda_graphs,
)
from tests.test_hf_equality import DEVICE, PROMPTS, STEPS, hf_model, ids, make_reqs, make_runner, run_greedy

# 120 tokens: 16 greedy steps take its sequence from 121 to 136 positions, past the 128-position graphs.
LONG_PAIR = [[(5 * i + 2) % 300 + 1 for i in range(120)], [4, 8, 15, 16, 23]]


def _eager_record(self, run_once):
    output = run_once()
    return (lambda: output.copy_(run_once())), output


def graph_runner(model_path, monkeypatch, **kwargs):
    """A model runner whose decodes go through a DecodeCudaGraphRunner, and the list of graphs each replayed."""
    if DEVICE.type == "cpu":
        monkeypatch.setattr(DecodeCudaGraphRunner, "_record", _eager_record)
    runner = make_runner(model_path, **kwargs)
    if DEVICE.type == "cpu":
        runner.graph_runner = DecodeCudaGraphRunner(runner)
    graphs = runner.graph_runner
    assert isinstance(graphs, DecodeCudaGraphRunner)
    replayed, load_batch = [], graphs.load_batch

    def counted(forward_batch):
        replayed.append(load_batch(forward_batch))
        return replayed[-1]

    monkeypatch.setattr(graphs, "load_batch", counted)
    return runner, replayed


def test_capture_ladders_follow_sglang():
    """SGLang 0.5.14's default decode sizes (server_args._generate_decode_cuda_graph_batch_sizes): 1, 2, 4, 8, 12,
    every 8 to 256, every 16 to 512, every 32 beyond, cut at the max with the max itself added."""
    assert generate_decode_cuda_graph_batch_sizes(32) == [1, 2, 4, 8, 12, 16, 24, 32]
    assert generate_decode_cuda_graph_batch_sizes(20) == [1, 2, 4, 8, 12, 16, 20]
    assert generate_decode_cuda_graph_batch_sizes(3) == [1, 2, 3]
    assert generate_decode_cuda_graph_batch_sizes(600)[-6:] == [480, 496, 512, 544, 576, 600]
    assert get_seq_lens_to_capture(512) == [128, 256, 512]
    assert get_seq_lens_to_capture(300) == [128, 256, 300]
    assert get_seq_lens_to_capture(100) == [100]


@pytest.mark.parametrize(("prompts", "max_bs", "expected"), [
    (PROMPTS, 4, {(4, 128)}),  # three requests run the four-row graph
    (LONG_PAIR, 4, {(2, 128), (2, 256)}),  # the longer sequence moves to the next length mid-generation
    (PROMPTS, 2, set()),  # above the largest captured batch: eager
])  # fmt: skip
@pytest.mark.parametrize("model", ["tiny_llama", "tiny_qwen3"])
def test_graph_decode_matches_hf_generate(model, prompts, max_bs, expected, request, monkeypatch):
    model_path = request.getfixturevalue(model)
    runner, replayed = graph_runner(model_path, monkeypatch, cuda_graph_max_bs=max_bs)
    _, tokens = run_greedy(runner, prompts, steps=STEPS)
    assert set(replayed) == expected and len(replayed) == (STEPS - 1) * bool(expected)
    hf = hf_model(model_path)
    for prompt, ours in zip(prompts, tokens):
        ref = hf.generate(ids(prompt), max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False)
        assert ours == ref[0, len(prompt) :].tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_logits_equal_the_eager_runners(tiny_llama, dtype, monkeypatch):
    """Step by step, on the same tokens, the graph's logits are the eager decode's: a long batch of four fills the
    (4, 256) graph's metadata, then three short prompts replay the (4, 128) one and the long batch's rows again
    (no stale rows or positions may survive); bfloat16 gathers grouped K/V head by head on CPU (cached per
    metadata, so rebuilt at every capture)."""
    eager = make_runner(tiny_llama, dtype=dtype)
    graphed, replayed = graph_runner(tiny_llama, monkeypatch, dtype=dtype, cuda_graph_max_bs=4)
    tolerance = {"atol": 1e-4, "rtol": 0} if dtype == torch.float32 else {"atol": 0.1, "rtol": 0.02}
    for prompts in (LONG_PAIR * 2, PROMPTS, LONG_PAIR * 2):
        (ids, _, eager_batch), (_, _, graph_batch) = (
            extend(make_reqs(prompts), eager),
            extend(make_reqs(prompts), graphed),
        )
        for _ in range(STEPS - 1):
            next_ids, eager_logits = decode(ids, eager_batch, eager)
            _, graph_logits = decode(ids, graph_batch, graphed)
            torch.testing.assert_close(graph_logits, eager_logits, **tolerance)
            ids = next_ids
        for runner in (eager, graphed):
            runner.req_to_token_pool.clear()
            runner.token_to_kv_pool_allocator.clear()
    assert set(replayed) == {(4, 128), (4, 256)}


def test_graph_workspaces_are_the_captured_ones(tiny_llama, monkeypatch):
    """The largest graph is captured first, so no later capture or replay regrows (frees) a workspace that an
    earlier graph wrote to; an eager decode above the largest captured batch grows the model runner's, not these."""
    runner, _ = graph_runner(tiny_llama, monkeypatch, cuda_graph_max_bs=2)
    runner.attn_backend.use_decode_kernel = False  # the eager decodes gather as on a GPU, not on the CPU kernel
    workspaces = runner.graph_runner.attn_backend._buffers
    captured = {name: buffer.data_ptr() for name, buffer in workspaces.items()}
    assert captured  # the captures gathered K/V through them
    run_greedy(runner, LONG_PAIR, steps=STEPS)  # replays of (2, 128) and (2, 256)
    run_greedy(runner, PROMPTS + LONG_PAIR, steps=4)  # five requests: eager
    assert {name: buffer.data_ptr() for name, buffer in workspaces.items()} == captured
    assert runner.attn_backend._buffers  # the eager decodes used the runner's own


@pytest.mark.parametrize(("device", "flags", "expected"), [
    ("cuda", {}, True),
    ("cuda", {"disable_cuda_graph": True}, False),
    ("cuda", {"enable_torch_compile": True}, False),
    ("cuda", {"tp_size": 2}, False),
    ("cpu", {}, False),
])  # fmt: skip
def test_which_runners_capture(device, flags, expected):
    server_args = types.SimpleNamespace(**{"disable_cuda_graph": False, "enable_torch_compile": False, "tp_size": 1,
                                           **flags})  # fmt: skip
    runner = types.SimpleNamespace(device=torch.device(device), server_args=server_args)
    assert uses_cuda_graphs(runner) is expected
