"""TorchNativeAttnBackend's extend paths against a naive causal attention computed request by request in float64.

A batch of requests of one length with no cached prefix attends in one call on the new k and v; other
batches attend request by request, gathering K/V from the pool only for requests with a cached prefix.
Every path must give the same attention, and the new tokens' K/V must land in the pool. Causal work of more
than one query tile runs ``causal_prefill_attention`` instead of SDPA (in float32 with grouped KV heads or for
one request); the tile is shrunk to 4 tokens here so that these small batches take that path, over several
tiles and a partial last one.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import minisgl.layers.attention.tiled_prefill as tiled_prefill
import minisgl.layers.attention.torch_native_backend as backend_module
from minisgl.layers.radix_attention import RadixAttention
from minisgl.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from minisgl.model_executor.forward_batch_info import ForwardMode

HEAD_DIM = 8


def naive_extend_attention(q, k_buffer, v_buffer, slots_per_request, prefix_lens, group, scale):
    """q: [tokens, heads, head_dim], requests' new tokens back to back; new token j of a request with prefix p
    sits at position p + j and sees positions 0..p + j; query head h reads KV head h // group."""
    outs, start = [], 0
    for slots, prefix_len in zip(slots_per_request, prefix_lens):
        keys, values = k_buffer[slots].double(), v_buffer[slots].double()  # [seq, kv_heads, head_dim]
        for j in range(len(slots) - prefix_len):
            visible = prefix_len + j + 1
            heads = []
            for h in range(q.shape[1]):
                scores = keys[:visible, h // group] @ q[start + j, h].double() * scale
                heads.append(torch.softmax(scores, 0) @ values[:visible, h // group])
            outs.append(torch.stack(heads))
        start += len(slots) - prefix_len
    return torch.stack(outs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
@pytest.mark.parametrize(
    "prefix_lens,extend_lens,attention_calls",
    [([0, 0, 0], [6, 6, 6], 1), ([0, 0, 0], [5, 9, 1], 3), ([0, 4, 2], [5, 3, 6], 3), ([3], [4], 1)],
    ids=["rectangular", "ragged", "prefixed", "one-prefixed"],
)
def test_extend_matches_naive_attention(dtype, heads, kv_heads, prefix_lens, extend_lens, attention_calls, monkeypatch):
    monkeypatch.setattr(tiled_prefill, "QUERY_TILE", 4)
    monkeypatch.setattr(
        tiled_prefill, "TILED_PREFILL_DTYPES", frozenset({torch.bfloat16, torch.float32})
    )  # regardless of this CPU's choice
    gen = torch.Generator().manual_seed(0)
    batch, num_slots = len(extend_lens), 64
    req_to_token_pool = ReqToTokenPool(8, 32, torch.device("cpu"))
    pool = MHATokenToKVPool(num_slots, dtype, kv_heads, HEAD_DIM, 1, torch.device("cpu"))
    for buffer in (pool.k_buffer[0], pool.v_buffer[0]):  # the cached prefixes' K/V (and junk elsewhere)
        buffer.copy_(torch.randn(buffer.shape, generator=gen).to(dtype))
    # Scattered slots, as an allocator hands them out after a few batches; each request's last slots are new.
    free = (torch.randperm(num_slots - 1, generator=gen) + 1).tolist()
    slots_per_request, new_slots, rows = [], [], torch.arange(1, batch + 1)
    for row, prefix_len, extend_len in zip(rows.tolist(), prefix_lens, extend_lens):
        slots, free = free[: prefix_len + extend_len], free[prefix_len + extend_len :]
        req_to_token_pool.req_to_token[row, : len(slots)] = torch.tensor(slots, dtype=torch.int32)
        slots_per_request.append(slots)
        new_slots += slots[prefix_len:]
    tokens = sum(extend_lens)
    q = torch.randn(tokens, heads * HEAD_DIM, generator=gen).to(dtype)
    k, v = (torch.randn(tokens, kv_heads, HEAD_DIM, generator=gen).to(dtype) for _ in range(2))
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    forward_batch = SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        req_to_token_pool=req_to_token_pool,
        req_pool_indices=rows,
        seq_lens_cpu=torch.tensor(seq_lens),
        extend_prefix_lens_cpu=prefix_lens,
        extend_seq_lens_cpu=extend_lens,
        token_to_kv_pool=pool,
        out_cache_loc=torch.tensor(new_slots),
    )
    calls = []
    sdpa, tiled = backend_module.F.scaled_dot_product_attention, backend_module.causal_prefill_attention
    monkeypatch.setattr(
        backend_module.F, "scaled_dot_product_attention", lambda *a, **kw: calls.append("sdpa") or sdpa(*a, **kw)
    )
    monkeypatch.setattr(backend_module, "causal_prefill_attention", lambda *a: calls.append("tiles") or tiled(*a))
    backend = backend_module.TorchNativeAttnBackend()
    layer = RadixAttention(heads, HEAD_DIM, HEAD_DIM**-0.5, kv_heads, layer_id=0)
    backend.init_forward_metadata(forward_batch)
    out = backend.forward_extend(q, k, v, layer, forward_batch)

    expected = naive_extend_attention(
        q.view(tokens, heads, HEAD_DIM), pool.k_buffer[0], pool.v_buffer[0], slots_per_request, prefix_lens,
        heads // kv_heads, layer.scaling,
    )  # fmt: skip
    assert out.dtype == dtype and out.shape == (tokens, heads * HEAD_DIM)
    assert len(calls) == attention_calls  # one call for a rectangular batch, else one per request
    # Work with a prefix (a mask) or within one tile stays on SDPA; longer causal work takes the tiles, in
    # float32 only with grouped KV heads or for one request.
    work = (
        [(any(prefix_lens), tokens, batch)]
        if attention_calls == 1
        else [(p, n, 1) for p, n in zip(prefix_lens, extend_lens)]
    )
    tiled_dtype = dtype == torch.bfloat16 or heads > kv_heads
    assert calls == ["tiles" if (tiled_dtype or r == 1) and not p and n > 4 else "sdpa" for p, n, r in work]
    slots = forward_batch.out_cache_loc
    assert torch.equal(pool.k_buffer[0][slots], k) and torch.equal(pool.v_buffer[0][slots], v)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2  # bfloat16 output rounding
    torch.testing.assert_close(out.double().view(tokens, heads, HEAD_DIM), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pairs_per_block", [1, 3])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
def test_causal_prefill_attention_matches_naive_across_blocks(heads, kv_heads, pairs_per_block, dtype, monkeypatch):
    """Tiles of 4 queries (the last one partial), and 1 or 3 (request, KV head) pairs per block of scores (the
    last block short): every boundary is crossed, eagerly and inside a compiled graph, and the matmul precision
    setting the op borrows is given back. Float32 stays float32 (1e-5 from a float64 reference)."""
    tokens, tile = 11, 4
    monkeypatch.setattr(tiled_prefill, "QUERY_TILE", tile)
    monkeypatch.setattr(tiled_prefill, "_SCORE_BLOCK_BYTES", pairs_per_block * tile * heads // kv_heads * tokens * 4)
    gen = torch.Generator().manual_seed(0)
    requests, scale = 2, HEAD_DIM**-0.5
    q = torch.randn(requests, tokens, heads, HEAD_DIM, generator=gen).to(dtype)
    k, v = (torch.randn(requests, tokens, kv_heads, HEAD_DIM, generator=gen).to(dtype) for _ in range(2))
    precision = torch.backends.mkldnn.matmul.fp32_precision

    out = tiled_prefill.causal_prefill_attention(q, k, v, scale)

    assert torch.backends.mkldnn.matmul.fp32_precision == precision
    slots = [list(range(r * tokens, (r + 1) * tokens)) for r in range(requests)]
    expected = naive_extend_attention(
        q.view(-1, heads, HEAD_DIM), k.view(-1, kv_heads, HEAD_DIM), v.view(-1, kv_heads, HEAD_DIM), slots,
        [0] * requests, heads // kv_heads, scale,
    )  # fmt: skip
    assert out.dtype == dtype and out.shape == q.shape
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2  # bfloat16 output rounding
    torch.testing.assert_close(out.double().view(-1, heads, HEAD_DIM), expected, atol=tolerance, rtol=tolerance)
    compiled = torch.compile(lambda q, k, v: tiled_prefill.causal_prefill_attention(q, k, v, scale), fullgraph=True)
    assert torch.equal(compiled(q, k, v), out)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
def test_causal_prefill_attention_stays_float32_at_onednn_sizes(heads, kv_heads):
    """At a real head_dim and tile, where ATen hands a float32 bmm to oneDNN (above 16**3 multiply-adds: the small
    tests above run on MKL), float32 stays float32 (1e-5 from float64): it fails if oneDNN rounds to bfloat16."""
    gen = torch.Generator().manual_seed(0)
    requests, tokens, head_dim = 2, 300, 64
    q = torch.randn(requests, tokens, heads, head_dim, generator=gen)
    k, v = (torch.randn(requests, tokens, kv_heads, head_dim, generator=gen) for _ in range(2))

    out = tiled_prefill.causal_prefill_attention(q, k, v, head_dim**-0.5)

    slots = [list(range(r * tokens, (r + 1) * tokens)) for r in range(requests)]
    expected = naive_extend_attention(
        q.view(-1, heads, head_dim), k.view(-1, kv_heads, head_dim), v.view(-1, kv_heads, head_dim), slots,
        [0] * requests, heads // kv_heads, head_dim**-0.5,
    )  # fmt: skip
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double().view(-1, heads, head_dim), expected, atol=1e-5, rtol=1e-5)
