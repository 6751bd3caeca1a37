"""TorchNativeAttnBackend's decode paths against a naive attention computed request by request in float64.

Eagerly on CPU, decode runs the C++ kernel (``cpu_decode.py``); without it (``kernel`` off: no compiler, or
CUDA) it picks its path by dtype and head grouping (float32; 16-bit gathered head by head, and upcast to float32
when each KV head has one query head), drops the mask when no sequence is padded, and attends in cache-sized
blocks of requests; traced by ``torch.compile`` it is ``fused_decode_attention``, with
the K/V write in the same graph, on the compiled forward's metadata (positions padded to whole blocks). Every
combination must give the same attention, and the new token's K/V must land in the pool.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import minisgl.layers.attention.cpu_decode as cpu_decode
import minisgl.layers.attention.torch_native_backend as backend_module
import minisgl.layers.cpu_kernels as cpu_kernels
from minisgl.layers import amx_utils
from minisgl.layers.attention.cpu_decode import decode_attention_cpu
from minisgl.layers.radix_attention import RadixAttention
from minisgl.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from minisgl.model_executor.forward_batch_info import ForwardMode

HEAD_DIM = 8


def naive_decode_attention(q, k_buffer, v_buffer, slots_per_request, group, scale):
    """q: [batch, heads, head_dim]; each request attends to its own slots; query head h reads KV head h // group."""
    outs = []
    for b, slots in enumerate(slots_per_request):
        keys, values = k_buffer[slots].double(), v_buffer[slots].double()  # [seq, kv_heads, head_dim]
        heads = []
        for h in range(q.shape[1]):
            scores = keys[:, h // group] @ q[b, h].double() * scale
            heads.append(torch.softmax(scores, 0) @ values[:, h // group])
        outs.append(torch.stack(heads))
    return torch.stack(outs)


# (compiled, C++ kernel, request block bytes): the kernel; gather + SDPA on whole batches and on one-request blocks;
# the traced kernel.
PATHS = {"eager-kernel": (False, True, None), "eager-sdpa": (False, False, None),
         "eager-sdpa-request-blocks": (False, False, 1), "torch-compile": (True, False, None)}  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
@pytest.mark.parametrize(
    "seq_lens", [[5, 9, 1, 7], [6, 6, 6, 6], [17, 3, 24, 9]], ids=["ragged", "equal", "several-blocks"]
)
@pytest.mark.parametrize("path", list(PATHS))
def test_decode_matches_naive_attention(dtype, heads, kv_heads, seq_lens, path, monkeypatch):
    compiled, kernel, block_bytes = PATHS[path]
    if block_bytes is not None:
        monkeypatch.setattr(backend_module, "_CACHE_BLOCK_BYTES", block_bytes)
    gen = torch.Generator().manual_seed(0)
    batch, num_slots = len(seq_lens), 64
    req_to_token_pool = ReqToTokenPool(8, 32, torch.device("cpu"))
    pool = MHATokenToKVPool(num_slots, dtype, kv_heads, HEAD_DIM, 1, torch.device("cpu"))
    # Scattered slots, as an allocator hands them out after a few batches; the last one is this step's token.
    free = (torch.randperm(num_slots, generator=gen) + 1).tolist()
    slots_per_request, rows = [], torch.arange(1, batch + 1)
    for row, seq_len in zip(rows.tolist(), seq_lens):
        slots, free = free[:seq_len], free[seq_len:]
        req_to_token_pool.req_to_token[row, :seq_len] = torch.tensor(slots, dtype=torch.int32)
        slots_per_request.append(slots)
    for buffer in (pool.k_buffer[0], pool.v_buffer[0]):
        buffer.copy_(torch.randn(buffer.shape, generator=gen).to(dtype))
    q = torch.randn(batch, heads, HEAD_DIM, generator=gen).to(dtype)
    k, v = (torch.randn(batch, kv_heads, HEAD_DIM, generator=gen).to(dtype) for _ in range(2))
    forward_batch = SimpleNamespace(
        forward_mode=ForwardMode.DECODE,
        req_to_token_pool=req_to_token_pool,
        req_pool_indices=rows,
        seq_lens=torch.tensor(seq_lens),
        seq_lens_cpu=torch.tensor(seq_lens),
        token_to_kv_pool=pool,
        out_cache_loc=torch.tensor([slots[-1] for slots in slots_per_request]),
    )
    backend = backend_module.TorchNativeAttnBackend(use_decode_kernel=kernel)
    traced_calls = []
    fused = backend_module.fused_decode_attention
    monkeypatch.setattr(backend_module, "fused_decode_attention", lambda *args: traced_calls.append(1) or fused(*args))
    kernel_calls = []
    cpu_kernel = backend_module.decode_attention_cpu
    monkeypatch.setattr(backend_module, "decode_attention_cpu", lambda *a: kernel_calls.append(1) or cpu_kernel(*a))
    layer = RadixAttention(heads, HEAD_DIM, HEAD_DIM**-0.5, kv_heads, layer_id=0)
    # as CPUGraphRunner.prepare_replay builds it for a compiled forward
    (backend.init_forward_metadata_out_graph if compiled else backend.init_forward_metadata)(forward_batch)
    forward_decode = backend.forward_decode
    if compiled:
        forward_decode = torch.compile(forward_decode, dynamic=True, fullgraph=True)
    out = forward_decode(q, k, v, layer, forward_batch)

    expected = naive_decode_attention(
        q, pool.k_buffer[0], pool.v_buffer[0], slots_per_request, heads // kv_heads, layer.scaling
    )
    assert out.dtype == dtype and out.shape == (batch, heads * HEAD_DIM)
    # Compiled, the traced kernel replaces every eager path; its K/V write must reach the pool itself.
    assert bool(traced_calls) == compiled and bool(kernel_calls) == kernel
    slots = forward_batch.out_cache_loc
    assert torch.equal(pool.k_buffer[0][slots], k) and torch.equal(pool.v_buffer[0][slots], v)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2  # bfloat16 output rounding
    torch.testing.assert_close(out.double().view(batch, heads, HEAD_DIM), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("longest", ["one-block", "two-blocks"])
def test_compiled_decode_metadata_pads_positions_to_whole_blocks(longest):
    """The compiled forward's decode metadata: lengths rounded up to ``DECODE_POSITION_BLOCK``, at least two blocks
    (one would specialize the graph), each padding position masked and pointing at slot 0; the eager metadata
    keeps the exact longest length."""
    block = backend_module.DECODE_POSITION_BLOCK
    seq_lens = [3 if longest == "one-block" else block + 1, 2]
    req_to_token_pool = ReqToTokenPool(4, 4 * block, torch.device("cpu"))
    req_to_token_pool.req_to_token[1:3] = torch.arange(1, 8 * block + 1, dtype=torch.int32).view(2, -1)
    forward_batch = SimpleNamespace(
        forward_mode=ForwardMode.DECODE,
        req_to_token_pool=req_to_token_pool,
        req_pool_indices=torch.tensor([1, 2]),
        seq_lens=torch.tensor(seq_lens),
        seq_lens_cpu=torch.tensor(seq_lens),
    )
    backend = backend_module.TorchNativeAttnBackend()
    backend.init_forward_metadata(forward_batch)
    assert backend.forward_metadata.kv_indices.shape == (2, max(seq_lens))
    backend.init_forward_metadata_out_graph(forward_batch)
    meta = backend.forward_metadata
    assert meta.kv_indices.shape == meta.valid.shape == (2, 2 * block) and meta.ragged
    assert meta.valid.sum(1).tolist() == seq_lens
    for row, seq_len in enumerate(seq_lens):
        assert torch.equal(meta.kv_indices[row, :seq_len], req_to_token_pool.req_to_token[row + 1, :seq_len])
        assert not meta.kv_indices[row, seq_len:].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "heads,kv_heads,head_dim",
    [(9, 3, 64), (4, 4, 24), (2, 1, 20), (2, 2, 128)],
    ids=["gqa-64", "mha-24", "gqa-20", "mha-128"],
)
@pytest.mark.parametrize("seq_lens", [[1, 13, 300, 777], [300] * 30], ids=["mixed", "many"])
@pytest.mark.parametrize("threads", [1, 2])
def test_cpu_decode_kernel_matches_naive_attention(dtype, heads, kv_heads, head_dim, seq_lens, threads):
    """The C++ kernel alone: lengths that end inside a score tile and span several chunks of positions (so chunks
    are combined, one request ends chunks before the longest), or many requests of two chunks each (combined in
    parallel at 9 heads of 64); scattered slots; head dims with a remainder past whole vectors (24 on AVX-512, 20
    on AVX2) or of several register blocks (128 on AVX2); q and the new K/V, which the kernel writes into the pools
    first, strided views, as the qkv projection's split leaves them; one and two threads."""
    assert cpu_decode.decode_attention_op() is not None  # this machine has a compiler: the kernel builds
    gen = torch.Generator().manual_seed(1)
    num_slots = 9100
    k_buffer, v_buffer = (torch.randn(num_slots, kv_heads, head_dim, generator=gen).to(dtype) for _ in range(2))
    slots = (torch.randperm(num_slots - 1, generator=gen) + 1).int()
    kv_indices = torch.zeros(len(seq_lens), max(seq_lens), dtype=torch.int32)
    slots_per_request, start = [], 0
    for row, seq_len in enumerate(seq_lens):
        kv_indices[row, :seq_len] = slots[start : start + seq_len]
        slots_per_request.append(slots[start : start + seq_len].long())
        start += seq_len
    qkv = torch.randn(len(seq_lens), (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    q, new_k, new_v = (part.view(len(seq_lens), -1, head_dim)  # views, not contiguous
                       for part in qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1))  # fmt: skip
    # Each request's newest slot gets the step's K/V: the kernel writes them where set_kv_buffer would.
    loc = torch.stack([request_slots[-1] for request_slots in slots_per_request])
    expected_k, expected_v = k_buffer.clone(), v_buffer.clone()
    expected_k[loc], expected_v[loc] = new_k, new_v
    scale = head_dim**-0.5
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = decode_attention_cpu(
            q, k_buffer, v_buffer, kv_indices, torch.tensor(seq_lens), scale, (new_k, new_v, loc)
        )
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(k_buffer, expected_k) and torch.equal(v_buffer, expected_v)
    expected = naive_decode_attention(q, expected_k, expected_v, slots_per_request, heads // kv_heads, scale)
    assert out.dtype == dtype and out.shape == q.shape
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2  # bfloat16 output rounding
    torch.testing.assert_close(out.double(), expected, atol=tolerance, rtol=tolerance)


def test_cpu_decode_kernel_refuses_a_slot_outside_the_pool():
    """A new K/V slot outside the pool is refused before any request's K/V is written: the first two requests'
    good slots stay empty when the third one's is bad."""
    pool = torch.zeros(4, 1, 8)
    assert cpu_decode.decode_attention_op() is not None
    new_kv = (torch.ones(3, 1, 8), torch.ones(3, 1, 8), torch.tensor([1, 2, 4]))
    with pytest.raises(RuntimeError, match="KV slot 4 is outside the 4-slot pool"):
        decode_attention_cpu(torch.zeros(3, 1, 8), pool, pool, torch.zeros(3, 2, dtype=torch.int32),
                             torch.tensor([2, 2, 2]), 1.0, new_kv)  # fmt: skip
    assert not pool.any()


@pytest.mark.parametrize("slot", [4, -1])
def test_cpu_decode_kernel_refuses_kv_indices_outside_the_pool(slot):
    """A request's position mapped to a slot the pool does not have fails with a message, not a read past it."""
    pool = torch.zeros(4, 1, 8)
    assert cpu_decode.decode_attention_op() is not None
    kv_indices = torch.tensor([[0, slot]], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=f"kv_indices holds slot {slot}, outside the 4-slot pool"):
        decode_attention_cpu(torch.zeros(1, 1, 8), pool, pool, kv_indices, torch.tensor([2]), 1.0)


def test_cpu_decode_kernel_rejects_a_wrong_index_dtype():
    """The kernel checks its inputs: int64 slot indices (the pool's table is int32) fail with a message."""
    pool = torch.zeros(4, 1, 8)
    assert cpu_decode.decode_attention_op() is not None
    with pytest.raises(RuntimeError, match="kv_indices: int32"):
        decode_attention_cpu(
            torch.zeros(1, 1, 8), pool, pool, torch.zeros(1, 2, dtype=torch.int64), torch.tensor([2]), 1.0
        )


def test_cpu_decode_kernel_build_failure_falls_back_to_sdpa(monkeypatch, capsys):
    """Where the kernels cannot be built (here: the build raises, as without a compiler), one line on stderr says so
    and the loader answers False, so eager decode stays on gather + SDPA (and the linears on aten's kernels: no
    blocked copies are kept)."""

    def failing_build(**kwargs):
        raise RuntimeError("Error building extension 'minisgl_cpu_avx2'\nlong compiler output")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", failing_build)
    assert cpu_kernels.cpu_kernels_built.__wrapped__() is False
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Error building extension 'minisgl_cpu_avx2'" in err and "SDPA" in err
    monkeypatch.setattr(cpu_decode, "cpu_kernels_built", lambda: False)  # as the cached loader then answers
    monkeypatch.setattr(amx_utils, "cpu_kernels_built", lambda: False)
    assert cpu_decode.decode_attention_op() is None and not cpu_decode.uses_decode_kernel(torch.zeros(1, 8))
    assert not amx_utils.blocked_linear_is_faster.__wrapped__(torch.float32)


def test_cpu_decode_kernel_without_a_compiler_falls_back(monkeypatch, capsys):
    """Without a C++ compiler, Inductor's ISA probe itself raises (before any build): still one line and None."""
    import torch._inductor.cpu_vec_isa as cpu_vec_isa

    def no_compiler():
        raise RuntimeError("Failed to find a working C++ compiler")

    monkeypatch.setattr(cpu_vec_isa, "pick_vec_isa", no_compiler)
    assert cpu_kernels.cpu_kernels_built.__wrapped__() is False
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "working C++ compiler" in err


def test_cpu_decode_kernel_build_name_is_an_identifier(monkeypatch):
    """An ISA whose name has spaces (AVX-512 VNNI: "avx512 avx512_vnni") still names a buildable extension: the
    name becomes a -D macro and a ninja target."""
    import torch._inductor.cpu_vec_isa as cpu_vec_isa

    names = []
    monkeypatch.setattr(cpu_vec_isa, "pick_vec_isa", cpu_vec_isa.VecAVX512VNNI)
    monkeypatch.setattr(torch.utils.cpp_extension, "load", lambda name, **kwargs: names.append(name))
    cpu_kernels.cpu_kernels_built.__wrapped__()
    assert " " in str(cpu_vec_isa.VecAVX512VNNI()) and names[0].isidentifier()
