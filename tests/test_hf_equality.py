"""minisgl against HF transformers on the same weights: prefill logits, greedy tokens, prefix reuse.

On CPU by default; ``MINISGL_TEST_DEVICE=cuda`` runs both engines on a GPU instead (bench/cuda.sh). There the long
prompts attend through SDPA and a prefill's MLP is one block: the tiled prefill attention and the MLP row blocks
are CPU-only, so their cases are skipped or expect no tiled call.
"""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

import minisgl.layers.attention.tiled_prefill as tiled_prefill
import minisgl.layers.attention.torch_native_backend as backend_module
from minisgl.bench_one_batch import decode, extend
from minisgl.configs.model_config import ModelConfig
from minisgl.managers.schedule_batch import Req
from minisgl.model_executor.model_runner import ModelRunner
from minisgl.models import llama
from minisgl.sampling.sampling_params import SamplingParams
from minisgl.server_args import ServerArgs
from minisgl.utils.hf_transformers_utils import get_config

PROMPTS = [[5, 17, 42, 9, 100, 3, 77], [8, 2, 31], [1, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71]]
STEPS = 16
DEVICE = torch.device(os.environ.get("MINISGL_TEST_DEVICE", "cpu"))
TILES_ON_DEVICE = DEVICE.type == "cpu"  # causal_prefill_attention and the MLP row blocks serve CPU prefills only


def make_runner(model_path, dtype=torch.float32, max_total_tokens=2048, **kwargs) -> ModelRunner:
    server_args = ServerArgs(
        model_path=str(model_path), max_total_tokens=max_total_tokens, device=str(DEVICE), **kwargs
    )
    model_config = ModelConfig.from_hf_config(get_config(str(model_path)), dtype)
    return ModelRunner(model_config, server_args, DEVICE)


def ids(prompt: list[int]) -> torch.Tensor:
    return torch.tensor([prompt], device=DEVICE)


def make_reqs(prompts):
    reqs = []
    for i, ids in enumerate(prompts):
        req = Req(i, "", ids, SamplingParams(temperature=0))
        req.full_untruncated_fill_ids, req.fill_len = req.origin_input_ids, len(ids)
        reqs.append(req)
    return reqs


def run_greedy(runner: ModelRunner, prompts, steps: int):
    """Prefill logits and ``steps`` greedy tokens per prompt, through the bench's extend/decode."""
    next_ids, logits, batch = extend(make_reqs(prompts), runner)
    tokens = [[t] for t in next_ids.tolist()]
    for _ in range(steps - 1):
        next_ids, _ = decode(next_ids, batch, runner)
        for out, t in zip(tokens, next_ids.tolist()):
            out.append(t)
    return logits, tokens


def hf_model(model_path, dtype=torch.float32):
    return AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, attn_implementation="sdpa").eval().to(DEVICE)


@pytest.fixture(params=["tiny_llama", "tiny_qwen2", "tiny_qwen3"])
def model_path(request):
    return request.getfixturevalue(request.param)


@pytest.mark.parametrize("mlp_blocks", [False, True], ids=["mlp-whole", "mlp-in-row-blocks"])
@pytest.mark.parametrize("prompts", [PROMPTS, [p[:3] for p in PROMPTS]], ids=["lengths-differ", "one-length"])
def test_prefill_logits_match_hf(model_path, prompts, mlp_blocks, monkeypatch):
    """Prompts of one length attend in one call per layer; prompts of different lengths, request by request.
    With a one-byte MLP block budget, a prefill's MLP runs one row at a time, as a long CPU prefill's does."""
    if mlp_blocks:
        if not TILES_ON_DEVICE:
            pytest.skip("the MLP row blocks are CPU-only: this case would repeat mlp-whole")
        monkeypatch.setattr(llama, "_MLP_BLOCK_BYTES", 1)
    logits, _ = run_greedy(make_runner(model_path), prompts, steps=1)
    hf = hf_model(model_path)
    with torch.no_grad():
        ref = torch.stack([hf(ids(p)).logits[0, -1] for p in prompts])
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)


def test_greedy_tokens_match_hf_generate(model_path):
    _, tokens = run_greedy(make_runner(model_path), PROMPTS, steps=STEPS)
    hf = hf_model(model_path)
    for prompt, ours in zip(PROMPTS, tokens):
        ref = hf.generate(ids(prompt), max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False)
        assert ours == ref[0, len(prompt) :].tolist()


@pytest.mark.parametrize("blocked_copies", [False, True], ids=["aten", "blocked"])
def test_decode_matches_hf_with_either_decode_linear_kernel(tiny_llama, blocked_copies, monkeypatch):
    """Decode batches (here 1 and 3 requests) read the column-blocked copies through the C++ kernel where it is the
    faster (forced either way here): the greedy tokens equal HF's both ways, and the copies exist exactly when
    chosen (and only on CPU)."""
    from minisgl.layers import amx_utils, linear

    monkeypatch.setattr(amx_utils, "blocked_linear_is_faster", lambda dtype: blocked_copies)
    runner = make_runner(tiny_llama)
    weights = [
        m.weight for m in runner.model.modules() if isinstance(m, linear.ReplicatedLinear | linear.RowParallelLinear)
    ]
    assert all(hasattr(w, "blocked_weight") == (blocked_copies and DEVICE.type == "cpu") for w in weights)
    hf = hf_model(tiny_llama)
    for prompts in (PROMPTS[:1], PROMPTS):
        _, tokens = run_greedy(runner, prompts, steps=STEPS)
        for prompt, ours in zip(prompts, tokens):
            ref = hf.generate(ids(prompt), max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False)
            assert ours == ref[0, len(prompt) :].tolist()


@pytest.mark.parametrize("gemm_copies", [False, True], ids=["onednn-gemm", "mkl-gemm"])
def test_prefill_matches_hf_with_either_gemm_kernel(tiny_llama, gemm_copies, monkeypatch):
    """Long inputs run MKL's GEMM on the plain weights where it is the faster (forced either way here, and from two
    rows on, so that every extend of the test prompts takes it): the prefill's logits and the greedy tokens
    equal HF's both ways, and the plain weights are kept exactly when chosen."""
    from minisgl.layers import amx_utils, linear

    monkeypatch.setattr(amx_utils, "mkl_gemm_is_faster", lambda: gemm_copies)
    monkeypatch.setattr(amx_utils, "MKL_GEMM_MIN_ROWS", 2)
    runner = make_runner(tiny_llama)
    weights = [
        m.weight for m in runner.model.modules() if isinstance(m, linear.ReplicatedLinear | linear.RowParallelLinear)
    ]
    assert all(hasattr(w, "gemm_weight") == (gemm_copies and w.is_mkldnn) for w in weights)
    logits, tokens = run_greedy(runner, PROMPTS, steps=STEPS)
    hf = hf_model(tiny_llama)
    for prompt, row_logits, row_tokens in zip(PROMPTS, logits, tokens):
        with torch.no_grad():
            ref_logits = hf(ids(prompt)).logits[0, -1]
        torch.testing.assert_close(row_logits, ref_logits, atol=1e-4, rtol=0)
        ref = hf.generate(ids(prompt), max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False)
        assert row_tokens == ref[0, len(prompt) :].tolist()


def test_extend_on_cached_prefix_equals_full_extend(tiny_llama):
    """The correctness mode's two-step prefill: cut_len tokens first, then the rest on the cached prefix."""
    cut = 2
    runner = make_runner(tiny_llama)
    full_logits, _ = run_greedy(runner, PROMPTS, steps=1)
    runner.req_to_token_pool.clear()
    runner.token_to_kv_pool_allocator.clear()

    reqs = make_reqs([p[:cut] for p in PROMPTS])
    extend(reqs, runner)
    for req, prompt in zip(reqs, PROMPTS):
        req.full_untruncated_fill_ids.extend(prompt[cut:])
        req.fill_len = len(prompt)
        req.prefix_indices = runner.req_to_token_pool.req_to_token[req.req_pool_idx, :cut].long()
    free_before = runner.token_to_kv_pool_allocator.available_size()
    _, logits, batch = extend(reqs, runner)
    assert batch.prefix_lens == [cut] * len(PROMPTS)
    # Only the suffix got new KV slots: the prefix was reused, not recomputed.
    assert free_before - runner.token_to_kv_pool_allocator.available_size() == sum(len(p) - cut for p in PROMPTS)
    torch.testing.assert_close(logits, full_logits, atol=1e-5, rtol=0)


# Prompts longer than one 128-token query tile: on CPU, an extend of these attends through
# causal_prefill_attention's tiles (one request alone, or two of one length at once) rather than SDPA.
LONG_PROMPTS = [[(7 * i + 3) % 300 + 1 for i in range(200)], [(11 * i + 5) % 300 + 1 for i in range(200)]]


@pytest.mark.parametrize("prompts", [PROMPTS, LONG_PROMPTS[:1], LONG_PROMPTS], ids=["short", "long", "two-long"])
def test_bfloat16_close_to_hf(tiny_llama, prompts, monkeypatch):
    monkeypatch.setattr(
        tiled_prefill, "TILED_PREFILL_DTYPES", frozenset({torch.bfloat16, torch.float32})
    )  # regardless of this CPU's choice
    tiled, calls = backend_module.causal_prefill_attention, []
    monkeypatch.setattr(backend_module, "causal_prefill_attention", lambda *a: calls.append(1) or tiled(*a))
    logits, _ = run_greedy(make_runner(tiny_llama, dtype=torch.bfloat16), prompts, steps=1)
    layers = 2  # the tiny Llama's; one tiled call per layer for a long extend
    assert len(calls) == (layers if prompts is not PROMPTS and TILES_ON_DEVICE else 0)
    hf = hf_model(tiny_llama, dtype=torch.bfloat16)
    with torch.no_grad():
        ref = torch.stack([hf(ids(p)).logits[0, -1] for p in prompts]).float()
    assert (logits - ref).abs().max() < 0.05 * ref.abs().max()


def test_bfloat16_through_float32_copies_close_to_hf(model_path, monkeypatch):
    """Where oneDNN cannot pack bfloat16 weights (forced here: an AVX2-only CPU), every linear and the LM head keep
    a float32 copy that batched rows read (``keep_float32_copy``): the prefill's and a batched decode step's
    logits stay as close to HF's bfloat16 ones as the packed path's (Qwen2's biases included)."""
    from minisgl.layers import amx_utils, linear

    if not TILES_ON_DEVICE:
        pytest.skip("CPU-only: GPU weights are never packed or copied")
    monkeypatch.setattr(amx_utils, "CPU_MULTIPLIES_BFLOAT16", False)
    runner = make_runner(model_path, dtype=torch.bfloat16)
    linears = [m for m in runner.model.modules() if isinstance(m, linear.ReplicatedLinear | linear.RowParallelLinear)]
    heads = [runner.model.lm_head.weight]
    assert all(w.float32_weight.dtype == torch.float32 for w in [m.weight for m in linears] + heads)

    next_ids, prefill_logits, batch = extend(make_reqs(PROMPTS), runner)
    decode_logits = decode(next_ids, batch, runner)[1]
    hf = hf_model(model_path, dtype=torch.bfloat16)
    with torch.no_grad():
        for logits, extra in ((prefill_logits, None), (decode_logits, next_ids.tolist())):
            sequences = PROMPTS if extra is None else [p + [t] for p, t in zip(PROMPTS, extra)]
            ref = torch.stack([hf(ids(p)).logits[0, -1] for p in sequences]).float()
            assert (logits - ref).abs().max() < 0.05 * ref.abs().max()


@pytest.mark.parametrize("prompts", [LONG_PROMPTS[:1], LONG_PROMPTS], ids=["long", "two-long"])
def test_float32_long_prompts_match_hf(tiny_llama, prompts, monkeypatch):
    """A float32 extend past one tile goes through causal_prefill_attention (the tiny Llama has grouped KV heads)
    and stays float32: HF's logits to 1e-4, as on every float32 path."""
    monkeypatch.setattr(tiled_prefill, "TILED_PREFILL_DTYPES", frozenset({torch.float32}))
    tiled, calls = backend_module.causal_prefill_attention, []
    monkeypatch.setattr(backend_module, "causal_prefill_attention", lambda *a: calls.append(1) or tiled(*a))
    logits, _ = run_greedy(make_runner(tiny_llama), prompts, steps=1)
    assert len(calls) == (2 if TILES_ON_DEVICE else 0)  # one tiled call per layer
    with torch.no_grad():
        ref = torch.stack([hf_model(tiny_llama)(ids(p)).logits[0, -1] for p in prompts])
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)


def test_llama3_rope_scaling_matches_hf(make_model):
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64, "rope_theta": 500000.0}  # fmt: skip
    path = make_model("llama", rope_parameters=rope)
    long_prompt = [list(range(1, 200))]
    logits, _ = run_greedy(make_runner(path), long_prompt, steps=1)
    with torch.no_grad():
        ref = hf_model(path)(ids(long_prompt[0])).logits[:, -1]
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)


def test_dummy_weights_are_deterministic(tiny_llama):
    a, _ = run_greedy(make_runner(tiny_llama, load_format="dummy"), PROMPTS, steps=1)
    b, _ = run_greedy(make_runner(tiny_llama, load_format="dummy"), PROMPTS, steps=1)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    real, _ = run_greedy(make_runner(tiny_llama), PROMPTS, steps=1)
    assert not torch.allclose(a, real)


def test_sharded_checkpoint_with_index_loads(tiny_llama, tmp_path):
    """A checkpoint split over several safetensors files with model.safetensors.index.json."""
    hf = hf_model(tiny_llama)
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").exists() and len(list(tmp_path.glob("*.safetensors"))) > 1
    sharded, _ = run_greedy(make_runner(tmp_path), PROMPTS, steps=1)
    single, _ = run_greedy(make_runner(tiny_llama), PROMPTS, steps=1)
    torch.testing.assert_close(sharded, single, atol=0, rtol=0)
