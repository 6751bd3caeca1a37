"""TorchNativeAttnBackend's decode paths against a naive attention computed request by request in float64.

Eagerly, decode picks its path by dtype and head grouping (float32; 16-bit gathered head by head, and
upcast to float32 when each KV head has one query head), drops the mask when no sequence is padded, and
attends in cache-sized blocks of requests; traced by ``torch.compile`` it is ``fused_decode_attention``, with
the K/V write in the same graph, on the compiled forward's metadata (positions padded to whole blocks). Every
combination must give the same attention, and the new token's K/V must land in the pool.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import minisgl.layers.attention.torch_native_backend as backend_module
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
@pytest.mark.parametrize(
    "seq_lens", [[5, 9, 1, 7], [6, 6, 6, 6], [17, 3, 24, 9]], ids=["ragged", "equal", "several-blocks"]
)
@pytest.mark.parametrize("block_bytes", [None, 1], ids=["whole-batch", "one-request-blocks"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "torch-compile"])
def test_decode_matches_naive_attention(dtype, heads, kv_heads, seq_lens, block_bytes, compiled, monkeypatch):
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
    backend = backend_module.TorchNativeAttnBackend()
    traced_calls = []
    fused = backend_module.fused_decode_attention
    monkeypatch.setattr(backend_module, "fused_decode_attention", lambda *args: traced_calls.append(1) or fused(*args))
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
    assert bool(traced_calls) == compiled
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
