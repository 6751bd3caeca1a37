"""minisgl's C++ causal prefill kernel (``cpu_prefill.py``) against a naive causal attention in float64, the
backend's choice of it, and whole models against HF transformers where every prefill's attention runs it.

The kernel needs ``head_dim`` in whole blocks of 64: the suite's tiny models (head_dim 16 and 24) keep SDPA and the
tiles, so the models here have head_dim 64. Shapes cross the kernel's 16-token units and 32-key score blocks, with
partial last ones, and 320 (request, KV head) pairs, more than one 4 MB wave of packed K/V holds (256 float32 or 162
bfloat16 pairs of 37 tokens); q, k and v are views split from one QKV tensor, as the model hands them over.
"""

from __future__ import annotations

import pytest
import torch

import minisgl.layers.attention.torch_native_backend as backend_module
from minisgl.layers.attention import cpu_prefill
from minisgl.layers.cpu_kernels import cpu_kernels_built
from tests.test_extend_attention import naive_extend_attention
from tests.test_hf_equality import LONG_PROMPTS, PROMPTS, hf_model, ids, make_runner, run_greedy
from tests.test_torch_compile import compiled_runner, profiled_rerun


def split_qkv(requests, tokens, heads, kv_heads, head_dim, dtype, seed=0):
    qkv = torch.randn(requests, tokens, heads + 2 * kv_heads, head_dim, generator=torch.Generator().manual_seed(seed))
    qkv = qkv.to(dtype)
    return qkv[:, :, :heads], qkv[:, :, heads : heads + kv_heads], qkv[:, :, heads + kv_heads :]


def naive(q, k, v, scale):
    requests, tokens, heads, head_dim = q.shape
    slots = [list(range(r * tokens, (r + 1) * tokens)) for r in range(requests)]
    flat = [x.reshape(requests * tokens, x.shape[2], head_dim) for x in (q, k, v)]
    out = naive_extend_attention(*flat, slots, [0] * requests, heads // k.shape[2], scale)
    return out.view(q.shape)


@pytest.fixture
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, torch.get_num_threads()], indirect=True, ids=["1-thread", "all-threads"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "requests,tokens,heads,kv_heads,head_dim",
    [(1, 1, 2, 1, 64), (2, 37, 9, 3, 64), (3, 33, 4, 4, 64), (1, 70, 8, 2, 128), (5, 37, 64, 64, 64)],
    ids=["one-token", "grouped-partial-blocks", "one-head-per-kv-head", "head-dim-128", "two-waves"],
)
def test_kernel_matches_naive_causal_attention(requests, tokens, heads, kv_heads, head_dim, dtype, threads):
    assert cpu_kernels_built()  # this machine has a compiler: the kernel builds
    q, k, v = split_qkv(requests, tokens, heads, kv_heads, head_dim, dtype)
    scale = head_dim**-0.5

    out = cpu_prefill.causal_prefill_attention_cpu(q, k, v, scale)

    assert out.dtype == dtype and out.shape == q.shape and out.is_contiguous()
    expected = naive(q, k, v, scale)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2  # bfloat16 output rounding
    torch.testing.assert_close(out.double(), expected, atol=tolerance, rtol=tolerance)


def test_kernel_rejects_what_it_does_not_block_for():
    assert cpu_kernels_built()
    q, k, v = split_qkv(1, 4, 2, 1, 16, torch.float32)
    with pytest.raises(RuntimeError, match="head_dim a multiple of"):
        cpu_prefill.causal_prefill_attention_cpu(q, k, v, 0.25)
    q, k, v = split_qkv(1, 4, 3, 2, 64, torch.float32)
    with pytest.raises(RuntimeError, match="whole groups"):
        cpu_prefill.causal_prefill_attention_cpu(q, k, v, 0.125)


def test_backend_sends_causal_prefills_to_the_kernel_where_it_applies(monkeypatch):
    """Without a mask, on CPU, head_dim 64, up to MAX_TOKENS tokens: the kernel; anything else keeps SDPA or the
    tiles. The kernel's and SDPA's answers agree."""
    calls = []
    kernel = backend_module.causal_prefill_attention_cpu
    monkeypatch.setattr(backend_module, "causal_prefill_attention_cpu", lambda *a: calls.append(1) or kernel(*a))
    attend = backend_module.TorchNativeAttnBackend._attend
    q, k, v = split_qkv(2, 20, 6, 2, 64, torch.float32)
    assert cpu_prefill.prefill_kernel_built() or torch.cpu._is_amx_tile_supported()
    expected = naive(q, k, v, 0.125)
    torch.testing.assert_close(attend(q, k, v, None, 0.125).double(), expected, atol=1e-5, rtol=1e-5)
    assert calls == ([1] if cpu_prefill.prefill_kernel_built() else [])
    calls.clear()
    monkeypatch.setattr(cpu_prefill, "MAX_TOKENS", 19)
    torch.testing.assert_close(attend(q, k, v, None, 0.125).double(), expected, atol=1e-5, rtol=1e-5)
    small = split_qkv(1, 20, 2, 1, 16, torch.float32)
    attend(*small, None, 0.25)
    mask = torch.ones(20, 20, dtype=torch.bool).tril()
    attend(q[:1], k[:1], v[:1], mask, 0.125)
    assert calls == []  # too long for the (shrunk) limit, a head_dim of 16, a mask: none runs the kernel


@pytest.fixture(scope="module")
def llama_head_dim_64(make_model):
    """A tiny Llama whose heads (4 query, 2 KV, head_dim 64) the kernel takes."""
    return make_model("llama", hidden_size=256, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)


def count_kernel_calls(monkeypatch) -> list:
    calls, kernel = [], backend_module.causal_prefill_attention_cpu
    monkeypatch.setattr(backend_module, "causal_prefill_attention_cpu", lambda *a: calls.append(1) or kernel(*a))
    return calls


@pytest.mark.parametrize("prompts", [PROMPTS, LONG_PROMPTS], ids=["short", "two-long"])
def test_float32_prefill_on_the_kernel_matches_hf(llama_head_dim_64, prompts, monkeypatch):
    """Each prompt alone (ragged lengths) or two of one length at once: one kernel call per request and layer, or
    per layer; HF's logits to 1e-4, as on every float32 path."""
    calls = count_kernel_calls(monkeypatch)
    logits, _ = run_greedy(make_runner(llama_head_dim_64), prompts, steps=1)
    layers = 2
    assert len(calls) == (layers * len(prompts) if prompts is PROMPTS else layers)
    with torch.no_grad():
        ref = torch.stack([hf_model(llama_head_dim_64)(ids(p)).logits[0, -1] for p in prompts])
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)


def test_bfloat16_prefill_on_the_kernel_close_to_hf(llama_head_dim_64, monkeypatch):
    calls = count_kernel_calls(monkeypatch)
    logits, _ = run_greedy(make_runner(llama_head_dim_64, dtype=torch.bfloat16), LONG_PROMPTS[:1], steps=1)
    assert len(calls) == 2
    hf = hf_model(llama_head_dim_64, dtype=torch.bfloat16)
    with torch.no_grad():
        ref = hf(ids(LONG_PROMPTS[0])).logits[:, -1].float()
    assert (logits - ref).abs().max() < 0.05 * ref.abs().max()


def test_compiled_prefill_calls_the_kernel_and_matches_hf(llama_head_dim_64):
    """Compiled, the kernel is an opaque op inside the extend's graph (seen by the profiler, one call per layer);
    the logits match HF to 1e-4 as eagerly."""
    runner, calls = compiled_runner(llama_head_dim_64)
    logits, ops = profiled_rerun(runner, LONG_PROMPTS[:1])
    expected_calls = 2 if cpu_prefill.prefill_kernel_built() else 0
    assert calls["extend"] == 2 and ops.count("minisgl_cpu::causal_prefill_attention") == expected_calls
    with torch.no_grad():
        ref = hf_model(llama_head_dim_64)(ids(LONG_PROMPTS[0])).logits[:, -1]
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)


def test_prefill_attention_bench_paths_agree(monkeypatch):
    """``bench/prefill_attention.py`` times SDPA, the tiles and the kernel: each returns the same causal attention."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "bench"))
    import prefill_attention

    q, k, v = split_qkv(2, 40, 6, 2, 64, torch.float32)
    expected = naive(q, k, v, 0.125)
    for path in (
        prefill_attention.sdpa,
        prefill_attention.causal_prefill_attention,
        cpu_prefill.causal_prefill_attention_cpu,
    ):
        torch.testing.assert_close(path(q, k, v, 0.125).double(), expected, atol=1e-5, rtol=1e-5)
