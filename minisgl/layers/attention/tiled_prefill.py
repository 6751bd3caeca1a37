"""``causal_prefill_attention``: causal attention of prompts with nothing cached, in query tiles on oneDNN's
batched matmul (CPU), and ``prefers_tiles``, where it is the faster kernel.

``TorchNativeAttnBackend`` sends an extend here instead of SDPA on CPUs without AMX, past one 128-token tile,
where minisgl's C++ prefill kernel (``cpu_prefill.py``, faster at every size measured) does not take it: no
compiler, a head_dim it does not block for, or more than its 4096 tokens. CPU SDPA's flash kernel multiplies its
small blocks at a fraction of the machine's peak there. SGLang's CPU
backend (``IntelAMXAttnBackend``) runs a C++ kernel instead, ``sgl_kernel``'s ``extend_attention_cpu``, over
the paged cache.
"""

from __future__ import annotations

import functools
import math

import torch

QUERY_TILE = 128  # query tokens per block of causal prefill: keys past the tile's end are never computed
# Float32 scores per block of (request, KV head) pairs: kept inside a CPU's L3. Each block costs two batched
# matmuls, a softmax and a copy per query tile, so within that, the fewer blocks the better. Eager prefill,
# in-process A/B on an AMD EPYC with a 32 MiB L3, 2 -> 8 MiB, ms: SmolLM2 bfloat16 1x512 258.5 -> 243.4,
# 32x256 3313 -> 3172, 8x128 373.5 -> 377.1 (noise); dummy134 bfloat16 1x512 162.4 -> 158.7; compiled SmolLM2
# bfloat16 1x512 229.8 -> 223.7.
_SCORE_BLOCK_BYTES = 8 << 20


def _onednn_bmm_keeps_float32() -> bool:
    """Whether a float32 ``bmm`` under ``fp32_precision = "bf16"`` still multiplies in IEEE float32 here.

    The setting allows oneDNN to round float32 inputs to bfloat16 (its bf16 "fpmath mode"); on an AVX-512 AMD
    EPYC (Zen 5) it keeps float32. Probed once, on both of ``causal_prefill_attention``'s product layouts (keys
    transposed, values plain), at a tile's size: ATen hands a float32 ``bmm`` to oneDNN only above 16**3
    multiply-adds, and smaller ones run on MKL, which would pass whatever oneDNN does. Values that bfloat16
    cannot hold: rounded, the products would be off by ~1e-3 to 1e-2, against a 1e-5 tolerance.
    """
    matmul = getattr(torch.backends.mkldnn, "matmul", None)
    if not hasattr(matmul, "fp32_precision"):  # torch < 2.9
        return False
    a, b = torch.rand(2, 2, 128, 64, generator=torch.Generator().manual_seed(0)).unbind()
    exact_scores = (a.double() @ b.double().transpose(1, 2)).float()
    exact_values = (a.double().transpose(1, 2) @ b.double()).float()
    precision = matmul.fp32_precision
    matmul.fp32_precision = "bf16"
    try:
        scores = torch.bmm(a, b.transpose(1, 2))  # as q @ k^T
        values = torch.bmm(a.transpose(1, 2).contiguous(), b)  # as probs @ v
    finally:
        matmul.fp32_precision = precision
    pairs = ((scores, exact_scores), (values, exact_values))
    return all(torch.allclose(got, exact, rtol=1e-5, atol=1e-5) for got, exact in pairs)


def _tiled_prefill_dtypes() -> frozenset[torch.dtype]:
    """The dtypes whose CPU causal prefill goes to ``causal_prefill_attention`` instead of SDPA.

    Only where it was measured to win and keeps each dtype's precision: without AMX (SDPA's flash kernel
    multiplies its blocks with AMX where present), with oneDNN's bfloat16 kernels (AVX512-BF16: the CPUs it was
    measured on) and with torch's ``fp32_precision`` setting (torch 2.9+), which is what sends a float32 ``bmm``
    to oneDNN rather than MKL; float32 also needs a oneDNN that keeps float32 under that setting.
    """
    has_precision_setting = hasattr(getattr(torch.backends.mkldnn, "matmul", None), "fp32_precision")
    if (
        torch.cpu._is_amx_tile_supported()
        or not has_precision_setting
        or not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    ):
        return frozenset()
    return frozenset([torch.bfloat16, torch.float32] if _ONEDNN_KEEPS_FLOAT32 else [torch.bfloat16])


_ONEDNN_KEEPS_FLOAT32 = _onednn_bmm_keeps_float32()
TILED_PREFILL_DTYPES = _tiled_prefill_dtypes()


def prefers_tiles(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether causal attention over q, k ``[requests, tokens, heads, head_dim]`` is faster in
    ``causal_prefill_attention`` than in SDPA: on CPU, in the dtypes of ``TILED_PREFILL_DTYPES``, for more than one
    query tile of work (requests x tokens; for one tile SDPA is about as fast in bfloat16 and faster in float32).
    Checked in this order so that a compiled graph guards on the length only where the length decides."""
    if q.device.type != "cpu" or q.dtype not in TILED_PREFILL_DTYPES:
        return False
    if q.dtype == torch.float32 and q.shape[2] == k.shape[2] and q.shape[0] != 1:
        # Float32 tiles win where query heads share a KV head, whose rows then fold into one GEMM, or for one
        # request; without that, a batch is faster on SDPA (dummy134 float32, in-process A/B, ms: 8x128
        # 481 -> 510, 32x256 4464 -> 4749; 1x512 257 -> 233).
        return False
    return q.shape[:2].numel() > QUERY_TILE


@functools.cache
def _causal_bias(tile: int, group: int, device: torch.device) -> torch.Tensor:
    """The causal mask of a diagonal block, rows (token t, head j of the group) against keys, as an additive bias
    (0 or -inf): a vectorized add is ~8x faster than ``masked_fill_``. Built once per shape, not per layer."""
    position = torch.arange(tile, device=device)
    future = position[None, :] > position.repeat_interleave(group)[:, None]
    return torch.zeros(future.shape, dtype=torch.float32, device=device).masked_fill_(future, float("-inf"))


@torch.library.custom_op("minisgl::causal_prefill_attention", mutates_args=())
def causal_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of bfloat16 or float32 requests with nothing cached, on oneDNN's batched matmul (CPU).

    q: ``[requests, tokens, heads, head_dim]``; k, v: ``[requests, tokens, kv_heads, head_dim]``. The query heads
    sharing a KV head become its rows, and queries go in tiles of ``QUERY_TILE`` tokens, each scoring only the
    keys up to its own last token. Without AMX, CPU SDPA's flash kernel multiplies its small blocks at ~70
    GFLOP/s on an AVX-512 CPU; ``bmm`` hands whole tiles to oneDNN (SmolLM2 prefill on an AMD EPYC, eager,
    in-process A/B, ms: bfloat16 1x512 246 -> 200, 8x128 382 -> 307, 32x256 3866 -> 3664; float32 1x512
    371 -> 319, 1x256 169 -> 155, 8x128 616 -> 581; on a slower EPYC VM, ``bench/prefill_levers.py``, bfloat16 1x512
    597 -> 598, 8x128 935 -> 880, 32x256 7329 -> 6842). The scores are float32 as in SDPA, and
    ``fp32_precision = "bf16"`` routes their float32 ``bmm`` to oneDNN (by default it goes to MKL). oneDNN may
    then multiply in bfloat16 (the setting allows it; on this AMD it keeps float32). That loses nothing for
    bfloat16 requests, whose q and k are upcast, exact bfloat16 values (the scale goes on q only where that keeps
    them exact), and their probabilities are rounded to bfloat16 for the product with V, as flash kernels do.
    Float32 requests take oneDNN only where it keeps float32 (``_ONEDNN_KEEPS_FLOAT32``), else MKL, and stay
    float32 throughout. An opaque op, so a compiled graph calls it as it is. SGLang's CPU backend runs a C++
    kernel instead, ``sgl_kernel``'s ``extend_attention_cpu``, over the paged cache.
    """
    requests, tokens, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group, pairs = heads // kv_heads, requests * kv_heads
    half = q.dtype != torch.float32
    queries = torch.empty(requests, kv_heads, tokens, group, head_dim, dtype=torch.float32, device=q.device)
    queries = queries.copy_(q.view(requests, tokens, kv_heads, group, head_dim).transpose(1, 2))
    queries = queries.view(pairs, tokens * group, head_dim)
    # A power-of-two scale (head_dim 64: 1/8) keeps q exact in bfloat16, so it goes on q; any other scale goes on
    # the float32 scores, as oneDNN may round a scaled q to bfloat16 (the extra pass: ~2% of a SmolLM2 prefill).
    # A float32 q is never rounded, so it takes any scale.
    scale_queries = not half or math.frexp(scale)[0] == 0.5
    if scale_queries:
        queries.mul_(scale)
    keys = torch.empty(requests, kv_heads, tokens, head_dim, dtype=torch.float32, device=q.device)
    keys = keys.copy_(k.transpose(1, 2)).view(pairs, tokens, head_dim)
    values = v.transpose(1, 2).reshape(pairs, tokens, head_dim)
    out = torch.empty(requests, kv_heads, tokens, group, head_dim, dtype=q.dtype, device=q.device)
    flat_out = out.view(pairs, tokens * group, head_dim)
    tile = min(QUERY_TILE, tokens)
    causal_bias = _causal_bias(tile, group, q.device)
    pairs_per_block = max(1, _SCORE_BLOCK_BYTES // (tile * group * tokens * 4))
    # Scratch for every block, allocated once: the OS page-faults and zeroes each fresh large tensor.
    scores_buffer = torch.empty(min(pairs_per_block, pairs) * tile * group * tokens, device=q.device)
    probs_buffer = torch.empty_like(scores_buffer, dtype=q.dtype) if half else None
    precision = torch.backends.mkldnn.matmul.fp32_precision
    if half or _ONEDNN_KEEPS_FLOAT32:
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    try:
        for block_start in range(0, pairs, pairs_per_block):
            block = slice(block_start, block_start + pairs_per_block)
            block_size = min(pairs_per_block, pairs - block_start)
            for start in range(0, tokens, tile):
                end = min(tokens, start + tile)
                rows = slice(start * group, end * group)
                shape = (block_size, (end - start) * group, end)
                scores = scores_buffer[: math.prod(shape)].view(shape)
                torch.bmm(queries[block, rows], keys[block, :end].transpose(1, 2), out=scores)
                if not scale_queries:
                    scores.mul_(scale)
                scores[:, :, start:end].add_(causal_bias[: (end - start) * group, : end - start])
                probs = torch.softmax(scores, -1, out=scores)
                if half:
                    probs = probs_buffer[: scores.numel()].view(shape).copy_(probs)
                torch.bmm(probs, values[block, :end], out=flat_out[block, rows])
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = precision
    return out.transpose(1, 2).contiguous().view(q.shape)  # contiguous, as the fake below promises a compiled graph


@causal_prefill_attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    return q.new_empty(q.shape)
