"""``--enable-torch-compile``: the compiled forward against HF transformers, the same oracle as eager.

Each runner compiles its extend and decode graphs once (the batch dimension is symbolic), so one runner per
model serves every test here. The counter checks that the compiled graph really ran.
"""

from __future__ import annotations

import pytest
import torch

import minisgl.layers.attention.tiled_prefill as tiled_prefill
import minisgl.model_executor.cpu_graph_runner as cpu_graph_runner
from minisgl.bench_one_batch import decode, extend
from minisgl.layers import amx_utils
from minisgl.model_executor.cpu_graph_runner import CPUGraphRunner
from minisgl.models import llama
from tests.test_hf_equality import LONG_PROMPTS, PROMPTS, STEPS, hf_model, make_reqs, make_runner, run_greedy


def compiled_runner(model_path, **kwargs):
    """A compiled runner, and counts of its compiled extends and decodes; ``small_decode`` counts the decodes
    that ran the graph tuned for padded small batches."""
    runner = make_runner(model_path, enable_torch_compile=True, **kwargs)
    calls = {"extend": 0, "decode": 0, "small_decode": 0}
    graph_runner = runner.graph_runner
    execute, small_decode = graph_runner.execute, graph_runner.compiled_small_decode

    def counted(forward_batch):
        calls["extend" if forward_batch.forward_mode.is_extend() else "decode"] += 1
        return execute(forward_batch)

    def counted_small_decode(*args):
        calls["small_decode"] += 1
        return small_decode(*args)

    graph_runner.execute, graph_runner.compiled_small_decode = counted, counted_small_decode
    return runner, calls


def small_decodes(runner, prompts: list[list[int]]) -> int:
    """1 where a decode of ``prompts`` runs the runner's tuned small-decode graph (padded to its rows), else 0."""
    return int(len(prompts) <= (runner.graph_runner.small_decode_rows or 0))


def profiled_rerun(runner, prompts: list[list[int]]):
    """The logits of one greedy step over ``prompts`` on a compiled runner, run twice (the first compiles and traces
    the custom ops' fakes), and the names of the ops the second run's profile saw."""
    run_greedy(runner, prompts, steps=1)
    runner.req_to_token_pool.clear()
    runner.token_to_kv_pool_allocator.clear()
    with torch.profiler.profile() as profile:
        logits, _ = run_greedy(runner, prompts, steps=1)
    return logits, [event.name for event in profile.events()]


def hf_greedy(hf, prompt: list[int], steps: int) -> list[int]:
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=steps, min_new_tokens=steps, do_sample=False)
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_qwen3"])
def compiled(request):
    path = request.getfixturevalue(request.param)
    return path, *compiled_runner(path)


@pytest.mark.parametrize(
    "prompts",
    [PROMPTS, PROMPTS[:1], PROMPTS * 2, [p[:3] for p in PROMPTS]],
    ids=["batch3", "batch1", "batch6", "batch3-one-length"],
)
def test_compiled_matches_hf(compiled, prompts):
    """Where small decodes get the tuned graph (``tunes_small_decodes``), batches of up to its rows (1 and 3 with
    AMX, 1 elsewhere) decode padded to that many, in that graph; the others (6 always) run unpadded in the general
    graph, over the C++ kernel's blocked copies where the probe kept them; prompts of one length extend in one
    attention call: all must equal HF."""
    path, runner, calls = compiled
    before = dict(calls)
    logits, tokens = run_greedy(runner, prompts, steps=STEPS)
    runner.req_to_token_pool.clear()
    runner.token_to_kv_pool_allocator.clear()
    assert calls["extend"] == before["extend"] + 1 and calls["decode"] == before["decode"] + STEPS - 1
    small = (STEPS - 1) * small_decodes(runner, prompts)
    assert calls["small_decode"] == before["small_decode"] + small
    hf = hf_model(path)
    with torch.no_grad():
        ref = torch.stack([hf(torch.tensor([p])).logits[0, -1] for p in prompts])
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)
    assert tokens == [hf_greedy(hf, p, STEPS) for p in prompts]


def test_compiled_prefill_with_mlp_in_blocks_matches_hf(compiled, monkeypatch):
    """A one-byte MLP block budget sends every extend down the long-prefill path: inside the compiled graph,
    each layer's MLP runs as a fixed number of row blocks (8 blocks of 23 tokens: seven of 2, one of 9)."""
    path, runner, calls = compiled
    monkeypatch.setattr(llama, "_MLP_BLOCK_BYTES", 1)
    before = calls["extend"]
    logits, _ = run_greedy(runner, PROMPTS, steps=1)
    runner.req_to_token_pool.clear()
    runner.token_to_kv_pool_allocator.clear()
    assert calls["extend"] == before + 1
    hf = hf_model(path)
    with torch.no_grad():
        ref = torch.stack([hf(torch.tensor([p])).logits[0, -1] for p in PROMPTS])
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("padded_rows", [4, 1], ids=["padded-to-4", "unpadded"])
def test_small_decode_graph_logits_match_hf(compiled, monkeypatch, padded_rows):
    """The autotuned graph's own kernels (Inductor's C++ GEMM template where it wins the timing) against HF's
    logits at every decode step, not only the greedy tokens: three requests padded to four rows (CPUs with
    AMX) and one request unpadded (elsewhere), both on any CPU."""
    prompts = PROMPTS if padded_rows > 1 else PROMPTS[:1]
    path, runner, calls = compiled
    monkeypatch.setattr(runner.graph_runner, "small_decode_rows", padded_rows)
    before = calls["small_decode"]
    next_ids, _, batch = extend(make_reqs(prompts), runner)
    sequences = [list(p) + [t] for p, t in zip(prompts, next_ids.tolist())]
    hf = hf_model(path)
    for _ in range(3):
        next_ids, logits = decode(next_ids, batch, runner)
        with torch.no_grad():
            ref = torch.stack([hf(torch.tensor([s])).logits[0, -1] for s in sequences])
        torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)
        for s, t in zip(sequences, next_ids.tolist()):
            s.append(t)
    runner.req_to_token_pool.clear()
    runner.token_to_kv_pool_allocator.clear()
    assert calls["small_decode"] == before + 3
    # Only the real requests attend, padded to four rows for the linears or not: a padding row scans no sequence.
    assert runner.attn_backend.forward_metadata.kv_indices.shape[0] == len(prompts) <= padded_rows


@pytest.mark.parametrize(
    ("dtype", "amx", "blocked", "tuned"),
    [
        (torch.float32, False, False, True),
        (torch.bfloat16, False, False, False),
        (torch.bfloat16, True, False, True),
        (torch.float32, True, True, False),
    ],
    ids=["float32", "bfloat16-without-amx", "bfloat16-with-amx", "blocked-copies"],
)
def test_small_decodes_get_the_tuned_graph_where_it_was_faster(tiny_llama, monkeypatch, dtype, amx, blocked, tuned):
    """Float32 small decodes, and 16-bit ones on CPUs with AMX, get the autotuned graph of their own, padded to
    min_packed_rows(); 16-bit ones without AMX run the general graph unpadded (the tuned one was slower there), and
    so does every dtype whose linears keep the C++ kernel's blocked copies (nothing left to tune)."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(cpu_graph_runner, "min_packed_rows", lambda: 4)  # no probe, and a padding to see
    monkeypatch.setattr(cpu_graph_runner, "blocked_linear_is_faster", lambda _dtype: blocked)
    graph_runner = make_runner(tiny_llama, enable_torch_compile=True, dtype=dtype).graph_runner
    assert (graph_runner.compiled_small_decode is not graph_runner.compiled_forward) == tuned
    assert graph_runner.small_decode_rows == (4 if tuned else None)


@pytest.mark.parametrize("blocked", [True, False], ids=["blocked-copies", "no-copies"])
def test_compiled_few_rows_call_the_blocked_kernel_where_kept(tiny_llama, monkeypatch, blocked):
    """Where the probe keeps blocked copies, a compiled decode of up to BLOCKED_MAX_ROWS rows passes every linear
    and the LM head to the C++ kernel (2 layers x 4 linears + 1, seen by the profiler), and a compiled extend of
    more rows only its head (3 last tokens); where it keeps none, no graph calls the kernel. Logits match HF."""
    monkeypatch.setattr(amx_utils, "blocked_linear_is_faster", lambda _dtype: blocked)
    monkeypatch.setattr(cpu_graph_runner, "blocked_linear_is_faster", lambda _dtype: blocked)
    runner, calls = compiled_runner(tiny_llama)
    assert (getattr(runner.model.lm_head.weight, "blocked_weight", None) is not None) == blocked
    run_greedy(runner, PROMPTS, steps=2)  # compiles the extend and the decode
    runner.req_to_token_pool.clear()
    runner.token_to_kv_pool_allocator.clear()
    next_ids, _, batch = extend(make_reqs(PROMPTS), runner)
    with torch.profiler.profile() as extend_profile:
        extend(make_reqs(PROMPTS), runner)
    with torch.profiler.profile() as decode_profile:
        _, logits = decode(next_ids, batch, runner)
    runner.req_to_token_pool.clear()
    runner.token_to_kv_pool_allocator.clear()
    assert calls == {"extend": 3, "decode": 2, "small_decode": 0}
    assert sum(len(p) for p in PROMPTS) > amx_utils.BLOCKED_MAX_ROWS
    for profile, kernel_calls in ((extend_profile, 1), (decode_profile, 2 * 4 + 1)):
        ops = [event.name for event in profile.events()]
        assert ops.count("minisgl_cpu::blocked_linear") == kernel_calls * blocked
    hf = hf_model(tiny_llama)
    with torch.no_grad():
        ref = torch.stack([hf(torch.tensor([p + [t]])).logits[0, -1] for p, t in zip(PROMPTS, next_ids.tolist())])
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)


def test_decode_over_max_bs_runs_eagerly(tiny_llama):
    runner, calls = compiled_runner(tiny_llama, torch_compile_max_bs=2)
    _, tokens = run_greedy(runner, PROMPTS, steps=4)
    assert calls == {"extend": 1, "decode": 0, "small_decode": 0}
    assert isinstance(runner.graph_runner, CPUGraphRunner)
    hf = hf_model(tiny_llama)
    assert tokens == [hf_greedy(hf, p, 4) for p in PROMPTS]


@pytest.mark.parametrize("multiplies_bfloat16", [True, False], ids=["bfloat16-arithmetic", "avx2-only"])
def test_compiled_bfloat16_close_to_hf(tiny_llama, monkeypatch, multiplies_bfloat16):
    """Also where the CPU has no bfloat16 arithmetic (forced either way): there the traced linears of batched rows
    convert their weights to float32, a conversion Inductor folds into a frozen constant (``apply_linear``)."""
    monkeypatch.setattr(
        tiled_prefill, "TILED_PREFILL_DTYPES", frozenset({torch.bfloat16, torch.float32})
    )  # regardless of this CPU's choice
    monkeypatch.setattr(amx_utils, "CPU_MULTIPLIES_BFLOAT16", multiplies_bfloat16)
    in_float32, traced = amx_utils.multiplies_in_float32, []  # the answer for each bfloat16 weight traced

    def spy(weight: torch.Tensor) -> bool:
        answer = in_float32(weight)
        if weight.dtype == torch.bfloat16:
            traced.append(answer)
        return answer

    monkeypatch.setattr(amx_utils, "multiplies_in_float32", spy)
    runner, calls = compiled_runner(tiny_llama, dtype=torch.bfloat16)
    logits, _ = run_greedy(runner, PROMPTS, steps=2)
    assert calls == {"extend": 1, "decode": 1, "small_decode": small_decodes(runner, PROMPTS)}
    assert set(traced) == {not multiplies_bfloat16}  # every bfloat16 linear traced: in float32 exactly when forced
    hf = hf_model(tiny_llama, dtype=torch.bfloat16)
    with torch.no_grad():
        ref = torch.stack([hf(torch.tensor([p])).logits[0, -1] for p in PROMPTS]).float()
    assert (logits - ref).abs().max() < 0.05 * ref.abs().max()
    # A 200-token prompt's compiled extend, past one tile (that the op runs in the graph is checked in float32
    # by test_compiled_float32_long_prompt_matches_hf).
    runner.req_to_token_pool.clear()
    runner.token_to_kv_pool_allocator.clear()
    long_logits, _ = run_greedy(runner, LONG_PROMPTS[:1], steps=1)
    with torch.no_grad():
        long_ref = hf(torch.tensor(LONG_PROMPTS[:1])).logits[:, -1].float()
    assert calls["extend"] == 2
    assert (long_logits - long_ref).abs().max() < 0.05 * long_ref.abs().max()


def test_compiled_float32_long_prompt_matches_hf(tiny_llama, monkeypatch):
    """A compiled float32 extend past one tile calls the opaque causal_prefill_attention inside its graph (seen by
    the profiler) and matches HF to 1e-4, as eager float32 does."""
    monkeypatch.setattr(tiled_prefill, "TILED_PREFILL_DTYPES", frozenset({torch.float32}))
    runner, calls = compiled_runner(tiny_llama)
    logits, ops = profiled_rerun(runner, LONG_PROMPTS[:1])
    assert calls["extend"] == 2 and ops.count("minisgl::causal_prefill_attention") == 2  # one per layer
    with torch.no_grad():
        ref = hf_model(tiny_llama)(torch.tensor(LONG_PROMPTS[:1])).logits[:, -1]
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("mkl_faster", [False, True], ids=["onednn-gemm", "mkl-gemm"])
def test_compiled_long_extend_runs_mkl_gemm_where_faster(tiny_llama, monkeypatch, mkl_faster):
    """Where the probe finds MKL's GEMM the faster, a compiled float32 extend of MKL_GEMM_MIN_ROWS rows or more
    (100 here) calls it through the opaque plain_weight_linear for each of its layers' four linears, as eager
    prefill reads its plain copies; a shorter extend leaves every linear to Inductor, and so does every extend
    where oneDNN is the faster. Logits match HF to 1e-4 either way."""
    monkeypatch.setattr(amx_utils, "_mkl_gemm_is_faster", mkl_faster)  # the probe's result, which the load keeps
    monkeypatch.setattr(amx_utils, "MKL_GEMM_MIN_ROWS", 100)
    runner, calls = compiled_runner(tiny_llama)
    hf = hf_model(tiny_llama)
    for prompt, gemm_calls in ((LONG_PROMPTS[0], 2 * 4 * mkl_faster), (PROMPTS[0], 0)):  # 2 layers, 4 linears
        run_greedy(runner, [prompt], steps=1)  # compiles
        runner.req_to_token_pool.clear()
        runner.token_to_kv_pool_allocator.clear()
        with torch.profiler.profile() as profile:
            logits, _ = run_greedy(runner, [prompt], steps=1)
        runner.req_to_token_pool.clear()
        runner.token_to_kv_pool_allocator.clear()
        ops = [event.name for event in profile.events()]
        assert ops.count("minisgl::plain_weight_linear") == gemm_calls
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[:, -1]
        torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)
    assert calls["extend"] == 4


def test_two_models_in_one_process_run_their_own_graphs(tiny_llama):
    """Same architecture and rope (one shared RotaryEmbedding), different weights: dynamo's guards must tell
    the two compiled forwards apart although most guards on modules are dropped."""
    first, _ = compiled_runner(tiny_llama)
    second, calls = compiled_runner(tiny_llama, load_format="dummy", random_seed=7)
    run_greedy(first, PROMPTS, steps=2)
    logits, tokens = run_greedy(second, PROMPTS, steps=2)
    assert calls == {"extend": 1, "decode": 1, "small_decode": small_decodes(second, PROMPTS)}
    ref_logits, ref_tokens = run_greedy(make_runner(tiny_llama, load_format="dummy", random_seed=7), PROMPTS, 2)
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=0)
    assert tokens == ref_tokens


def test_every_compiled_graph_drops_the_module_guards(tiny_llama, monkeypatch):
    """Both compiled forwards (the general one and the tuned small-decode one) check only the guards
    ``keep_weight_identity_guards`` keeps: torch.compile pops the filter out of the options it is given, so the
    options must not be shared between the two. Batch 1 compiles an extend graph and the small-decode graph."""
    import minisgl.model_executor.cpu_graph_runner as cpu_graph_runner

    filtered = []
    real = cpu_graph_runner.keep_weight_identity_guards

    def counted(guard_entries):
        keep = real(guard_entries)
        filtered.append((len(keep), sum(keep)))
        return keep

    monkeypatch.setattr(cpu_graph_runner, "keep_weight_identity_guards", counted)
    monkeypatch.setattr(cpu_graph_runner, "blocked_linear_is_faster", lambda _dtype: False)  # the tuned graph too
    runner, calls = compiled_runner(tiny_llama)
    run_greedy(runner, PROMPTS[:1], steps=3)
    assert calls == {"extend": 1, "decode": 2, "small_decode": 2}
    assert len(filtered) == 2 and all(kept < total / 2 for total, kept in filtered), filtered


def python_guards(compiled) -> list[str]:
    """The guards dynamo evaluates in Python (lambda guards), over every graph compiled for ``compiled``'s code
    (that of ``torch.compile``'s wrapper of a module's bound method, which every compiled forward shares)."""
    from torch._C._dynamo.guards import LAMBDA_GUARD
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    found = []

    def add(guard):
        found.extend(part.split("#")[0] for part in guard.verbose_code_parts())  # the code, not the comment

    def visit(manager):
        for guard in manager.get_leaf_guards():
            if isinstance(guard, LAMBDA_GUARD):
                add(guard)
        for child in manager.get_child_managers():
            visit(child)

    for entry in _debug_get_cache_entry_list(compiled._torchdynamo_orig_callable):
        root = entry.guard_manager.root
        visit(root)
        for guard in root.get_epilogue_lambda_guards():  # the shape guards, checked after the tree's
            add(guard)
    return found


def test_module_floats_and_pool_sizes_are_not_guarded_in_python(tiny_llama):
    """RMSNorm's epsilon and attention's scaling are constants in the compiled graphs, and the KV pool's size is
    static: neither needs a Python guard before each call (traced as symbolic floats and duck-sized buffers, a
    12-layer model had ~100 of them)."""
    runner, calls = compiled_runner(tiny_llama)
    run_greedy(runner, PROMPTS[:2], steps=3)
    assert calls["extend"] and calls["decode"]
    guards = python_guards(runner.graph_runner.compiled_forward)
    assert guards, "the shape guards on the decode's length are Python guards: none found means none were read"
    offending = [g for g in guards if "variance_epsilon" in g or ".scaling" in g or "_buffer[" in g]
    assert not offending, offending
