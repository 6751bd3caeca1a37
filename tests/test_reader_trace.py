"""reader's static chain against a real run: every static edge from ``extend``/``decode`` down must execute.

A ``sys.setprofile`` hook records (caller, callee) pairs of minisgl functions while ``extend`` and ``decode``
run on a tiny Llama (greedy and sampled requests in one batch, float32 and bfloat16). Executed minisgl
calls that the static chain lacks are printed (``pytest -s``), not asserted: the chain is allowed to be
incomplete, never wrong.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from reader.chains import build_chain
from reader.index import module_name

pytest.importorskip("torch")
if sys.version_info < (3, 11):
    pytest.skip("code.co_qualname needs Python 3.11", allow_module_level=True)

PKG = Path(__file__).resolve().parent.parent / "minisgl"
# Static edges that only run under conditions the tiny run does not set up (reason given).
CONDITIONAL = {
    (
        "minisgl.layers.vocab_parallel_embedding.VocabParallelEmbedding.forward",
        "minisgl.distributed.parallel_state.tensor_model_parallel_all_reduce",
    ): "only with tensor parallelism (tp_size > 1)",
    **{
        ("minisgl.layers.rotary_embedding.RotaryEmbedding.forward", f"minisgl.layers.rotary_embedding.{callee}"): (
            "aten's RoPE: traced, on CUDA, or without the C++ kernels (tests/test_layers.py runs it on CPU)"
        )
        for callee in ("RotaryEmbedding._lookup", "_rotate")
    },
    (
        "minisgl.layers.attention.cpu_prefill.prefill_kernel_built",
        "minisgl.layers.cpu_kernels.cpu_kernels_built",
    ): "cached: only a process's first call runs, made by the first layer that asks (uses_cpu_kernels here)",
    (
        "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend._gather_kv",
        "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend._workspace",
    ): "only for 16-bit K/V with one query head per KV head, upcast to float32 (the tiny Llama groups 2 heads)",
    **{
        edge: "only with --enable-torch-compile (tests/test_torch_compile.py counts the compiled calls)"
        for edge in [
            (
                "minisgl.layers.radix_attention.RadixAttention.forward",
                "minisgl.layers.radix_attention.unified_attention",
            ),
            (
                "minisgl.layers.radix_attention.unified_attention",
                "minisgl.layers.attention.base_attn_backend.AttentionBackend.forward",
            ),
            (
                "minisgl.layers.radix_attention.unified_attention",
                "minisgl.model_executor.forward_context.get_forward_context",
            ),
            (
                "minisgl.model_executor.cpu_graph_runner.CPUGraphRunner.can_run_graph",
                "minisgl.model_executor.forward_batch_info.ForwardMode.is_extend",
            ),
            (
                "minisgl.model_executor.cpu_graph_runner.CPUGraphRunner.execute",
                "minisgl.model_executor.forward_batch_info.ForwardMode.is_decode",
            ),
            (
                "minisgl.model_executor.cpu_graph_runner.CPUGraphRunner.execute",
                "minisgl.model_executor.forward_context.forward_context",
            ),
            (
                "minisgl.layers.radix_attention.RadixAttention.forward",
                "minisgl.model_executor.forward_batch_info.ForwardMode.is_extend",
            ),
            (
                "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_decode",
                "minisgl.layers.attention.torch_native_backend.fused_decode_attention",
            ),
            (
                "minisgl.model_executor.cpu_graph_runner.CPUGraphRunner.execute",
                "minisgl.model_executor.cpu_graph_runner.CPUGraphRunner.prepare_replay",
            ),
            (
                "minisgl.model_executor.cpu_graph_runner.CPUGraphRunner.prepare_replay",
                "minisgl.model_executor.forward_batch_info.ForwardMode.is_decode",
            ),
            (
                "minisgl.model_executor.cpu_graph_runner.CPUGraphRunner.prepare_replay",
                "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend.init_forward_metadata_out_graph",
            ),
            (
                "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend.init_forward_metadata_out_graph",
                "minisgl.model_executor.forward_batch_info.ForwardMode.is_decode",
            ),
            (
                "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend.init_forward_metadata_out_graph",
                "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend.decode_metadata",
            ),
            (
                "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend.init_forward_metadata_out_graph",
                "minisgl.layers.attention.torch_native_backend.TorchNativeAttnBackend.init_forward_metadata",
            ),
            (
                "minisgl.model_executor.model_runner.ModelRunner.forward",
                "minisgl.model_executor.cpu_graph_runner.CPUGraphRunner.can_run_graph",
            ),
            (
                "minisgl.model_executor.model_runner.ModelRunner.forward",
                "minisgl.model_executor.cpu_graph_runner.CPUGraphRunner.execute",
            ),
        ]
    },  # fmt: skip
}


def _fqn(code) -> str | None:
    path = Path(code.co_filename)
    if not path.is_relative_to(PKG):
        return None
    mod, _ = module_name(PKG, path)
    return f"{mod}.{code.co_qualname.split('.<')[0]}"


def _static_edges(root) -> set[tuple[str, str]]:
    """(caller, callee) pairs below ``root``; an abstract method's dispatch child is called by its caller."""
    out = set()

    def walk(node, caller):
        for child in node.children:
            if child.via == "dispatch":
                out.add((caller, child.qname))
            elif child.qname.rsplit(".", 1)[-1][:1].isupper():
                continue  # a class without its own __init__ (dataclass): generated code, not traced
            elif any(g.via == "dispatch" for g in child.children):
                pass  # an abstract method never runs; its overrides are called instead
            else:
                out.add((node.qname, child.qname))
            walk(child, node.qname if child.via != "dispatch" else caller)

    walk(root, None)
    return out


def _find(node, qname):
    return next(n for n in node.walk() if n.qname == qname and not n.marker)


def test_static_chain_edges_execute(tiny_llama, make_model, monkeypatch):
    import torch

    import minisgl.layers.attention.tiled_prefill as tiled_prefill
    import minisgl.layers.cpu_kernels as cpu_kernels
    from minisgl.bench_one_batch import decode, extend
    from minisgl.managers.schedule_batch import Req
    from minisgl.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from minisgl.sampling.sampling_params import SamplingParams
    from tests.test_cuda_graph import _eager_record
    from tests.test_hf_equality import make_runner

    chain = build_chain("latency")
    static = set()
    for entry in ("minisgl.bench_one_batch.extend", "minisgl.bench_one_batch.decode"):
        static |= _static_edges(_find(chain.root, entry))

    def make_reqs(first_prompt):
        reqs = []
        for i, (ids, params) in enumerate(
            [(first_prompt, SamplingParams(temperature=0)), ([8, 2, 31], SamplingParams(temperature=0.8, top_k=5))]
        ):
            req = Req(i, "", ids, params)
            req.full_untruncated_fill_ids, req.fill_len = req.origin_input_ids, len(ids)
            reqs.append(req)
        return reqs

    # float32 and bfloat16: a bfloat16 extend of more than one query tile (2 tokens here) attends through
    # causal_prefill_attention.
    monkeypatch.setattr(tiled_prefill, "QUERY_TILE", 2)
    monkeypatch.setattr(
        tiled_prefill, "TILED_PREFILL_DTYPES", frozenset({torch.bfloat16, torch.float32})
    )  # regardless of this CPU's choice
    runners = [make_runner(tiny_llama, dtype=dtype) for dtype in (torch.float32, torch.bfloat16)]
    # one whose eager decodes gather + SDPA, as where the C++ decode kernel is not built (and on CUDA); bfloat16,
    # so grouped 16-bit K/V are gathered head by head
    runners.append(make_runner(tiny_llama, dtype=torch.bfloat16))
    runners[-1].attn_backend.use_decode_kernel = False
    # and one whose decodes go through DecodeCudaGraphRunner, its "graphs" replayed eagerly on CPU (as in
    # tests/test_cuda_graph.py), for the CUDA-graph edges of ModelRunner.forward
    monkeypatch.setattr(DecodeCudaGraphRunner, "_record", _eager_record)
    runners.append(make_runner(tiny_llama, cuda_graph_max_bs=2))
    runners[-1].graph_runner = DecodeCudaGraphRunner(runners[-1])
    # and one with head_dim 64, whose extends attend in the C++ prefill kernel (cpu_prefill.py)
    head_dim_64 = make_model("llama", hidden_size=256, intermediate_size=256, num_attention_heads=4)
    runners.append(make_runner(head_dim_64))
    executed: set[tuple[str, str]] = set()

    def hook(frame, event, arg):
        if event != "call":
            return
        callee = _fqn(frame.f_code)
        if callee is None or frame.f_code.co_name.startswith("<"):
            return
        f = frame.f_back
        while f is not None and _fqn(f.f_code) is None:
            f = f.f_back
        if f is not None:
            executed.add((_fqn(f.f_code), callee))

    torch.manual_seed(0)
    cpu_kernels.cpu_kernels_built.cache_clear()  # loaded once per process, at load: load it again under the hook
    sys.setprofile(hook)
    try:
        for runner in runners:
            # Prompts of two lengths, then of one length: extend attends request by request, then in one call.
            for first_prompt in ([5, 17, 42, 9], [5, 17, 42]):
                next_ids, _, batch = extend(make_reqs(first_prompt), runner)
                decode(next_ids, batch, runner)
                runner.req_to_token_pool.clear()
                runner.token_to_kv_pool_allocator.clear()
    finally:
        sys.setprofile(None)

    assert executed, "the profile hook saw no minisgl calls"
    missing = sorted(e for e in static - executed if e not in CONDITIONAL)
    assert not missing, "static edges that never ran:\n" + "\n".join(f"{a} -> {b}" for a, b in missing)
    below = {q for a, b in static for q in (a, b)}
    unseen = sorted((a, b) for a, b in executed - static if a in below)
    print(f"\n{len(static)} static edges ran; executed minisgl calls the static chain lacks ({len(unseen)}):")
    for a, b in unseen:
        print(f"  {a} -> {b}")
