"""TorchNativeAttnBackend: attention with ``scaled_dot_product_attention``, K/V read through ``req_to_token``.

Extend handles one request at a time, because each has its own prefix and length: its queries attend to
the cached prefix plus its own new tokens (causal). A request with no cached prefix attends to its new k
and v as they are, and a batch of such requests, all of one length, attends in one SDPA call (on CPUs without
AMX, such a request or batch attends in one call of minisgl's C++ kernel instead, ``cpu_prefill.py``; where it
is not built, past one 128-token tile, in one ``causal_prefill_attention`` call: tiles of queries on oneDNN's
batched matmul, in ``tiled_prefill.py``; bfloat16 always, float32 with grouped KV heads or for one request).
Decode is batched: each request's K/V are gathered up to the longest sequence (padding masked), the query heads sharing a KV head ride along as extra query rows, and one SDPA call serves
the batch (on CPU, a block of requests small enough for its K/V to stay in cache); on CPU, where its C++ kernel
is built, one call of that kernel reads the pool in place instead (``cpu_decode.py``). Inside a
``torch.compile`` graph (``--enable-torch-compile``), decode runs ``fused_decode_attention`` instead: plain
tensor ops that Inductor fuses, with the K/V write and the gathers, into the model's graph (its positions
padded to whole blocks by ``init_forward_metadata_out_graph``).

SGLang's ``TorchNativeAttnBackend`` loops over requests in both modes; its Triton, FlashInfer and
FlashAttention backends build ``kv_indptr``/``kv_indices`` (or page tables) from the same
``req_to_token`` table instead of gathering.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from minisgl.layers.attention.base_attn_backend import AttentionBackend
from minisgl.layers.attention.cpu_decode import decode_attention_cpu, uses_decode_kernel
from minisgl.layers.attention.cpu_prefill import causal_prefill_attention_cpu, uses_prefill_kernel
from minisgl.layers.attention.tiled_prefill import causal_prefill_attention, prefers_tiles

if TYPE_CHECKING:
    from minisgl.layers.radix_attention import RadixAttention
    from minisgl.model_executor.forward_batch_info import ForwardBatch


# Gathered K/V per block of decode requests: inside a CPU's L3. Fewer, larger blocks cost fewer calls per layer
# (eager decode on an AMD EPYC with a 32 MiB L3, ms/step, 4 -> 8 MiB: dummy134 bfloat16 8x128 15.6 -> 13.9,
# 32x256 55.0 -> 52.1; SmolLM2 bfloat16 32x256 47.3 -> 45.7; dummy134 float32 32x256 49.8 -> 47.0).
_CACHE_BLOCK_BYTES = 8 << 20
# Positions per block of the compiled decode's V sum (see fused_decode_attention): 8 measured fastest of 4-16 for
# dummy134's and SmolLM2's shapes.
DECODE_POSITION_BLOCK = 8


@dataclass
class ExtendMetadata:
    kv_indices: list[torch.Tensor]  # per request: KV slots of positions 0..seq_len-1
    masks: list[torch.Tensor | None]  # per request: causal mask offset by the prefix, None if no prefix
    q_slices: list[slice]  # per request: its rows in the flat batch
    rectangular: bool  # no request has a prefix and all extend the same number of tokens


@dataclass
class DecodeMetadata:
    kv_indices: torch.Tensor  # [batch, max_seq_len] KV slots (padding positions point at slot 0)
    valid: torch.Tensor  # [batch, max_seq_len], True where a position is real
    ragged: bool  # some positions are padding, so SDPA needs ``valid`` as a mask
    head_major_rows: torch.Tensor | None = None  # built by the first layer that needs it

    def get_head_major_rows(self, kv_heads: int) -> torch.Tensor:
        """``[batch, kv_heads, max_seq_len]`` rows of the pool viewed as ``[slots * kv_heads, head_dim]``."""
        if self.head_major_rows is None:
            heads = torch.arange(kv_heads, device=self.kv_indices.device)
            self.head_major_rows = self.kv_indices[:, None, :] * kv_heads + heads[None, :, None]
        return self.head_major_rows


def fused_decode_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    kv_indices: torch.Tensor,
    valid: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Decode attention in plain tensor ops, for TorchInductor to fuse (``--enable-torch-compile``).

    q: ``[batch, kv_heads, group, head_dim]``; kv_indices, valid: ``[batch, seq_len]``, seq_len a multiple of
    ``DECODE_POSITION_BLOCK`` (``init_forward_metadata_out_graph`` pads it). Written naively
    (gather, product, sum), the K and V gathers fuse into the loops that consume them: the pool is read once,
    in place, accumulating in float32, with no gathered copy and no upcast pass. Returns q's shape and dtype.
    """
    # A view onto itself, which Inductor can only give a real buffer: q is materialized once, RoPE included.
    # Otherwise Inductor inlines q's RoPE into the score loop and redoes it for every key position (SmolLM2
    # bfloat16 decode at batch 32, each run in-process against the custom-op path: 58.4 -> 71.9 ms/step without
    # this line, 63.2 -> 52.4 with it).
    q = q.contiguous()
    q = torch.as_strided(q, q.shape, [math.prod(q.shape[i + 1 :]) for i in range(q.dim())])
    keys = k_buffer[kv_indices][:, :, :, None]  # [batch, seq, kv_heads, 1, head_dim]
    scores = (q[:, None].float() * keys.float()).sum(-1) * scale  # [batch, seq, kv_heads, group]
    scores = scores.masked_fill(~valid[:, :, None, None], float("-inf"))
    # Softmax written out, its division deferred to the output: with softmax(), Inductor divides each
    # probability again inside the loop over V, once per head_dim vector and position. Dividing the
    # [..., head_dim] sums once instead: the kernel alone, warm, 32 -> 21 us at 144 positions and 204 -> 93 us
    # at 600 (dummy134 float32, batch 1); the whole decode step, in-process A/B of two compiled engines, eight
    # alternating runs: dummy134 float32 batch 1, median ratio 0.95; SmolLM2 float32 batch 1 within noise.
    weights = (scores - scores.amax(1, keepdim=True)).exp()
    # The V sum runs over blocks of positions first, then over the blocks. Summed over all positions in one loop,
    # Inductor walks the pool once per KV head and 16-float chunk of head_dim, each walk reading one cache line
    # per position from rows a pool row apart; per block, a block's rows are read whole and the chunks find them
    # in cache. This kernel alone, cold pool, us per layer: dummy134's shape, float32 batch 1, at 528 positions
    # 143 -> 96, at 2000 716 -> 489; SmolLM2's at 2000 316 -> 240; dummy134's bfloat16 8x160 317 -> 215. The
    # step, float32 batch 1, in-process A/B of two compiled engines, ms: dummy134 1x512 15.0 -> 14.1, 1x2000
    # 20.9 -> 18.0; SmolLM2 1x512 17.9 -> 16.9.
    batch, blocks = kv_indices.shape[0], kv_indices.shape[1] // DECODE_POSITION_BLOCK
    values = v_buffer[kv_indices.view(batch, blocks, DECODE_POSITION_BLOCK)][..., None, :]
    block_weights = weights.view(batch, blocks, DECODE_POSITION_BLOCK, *weights.shape[2:])[..., None]
    out = (block_weights * values.float()).sum(2).sum(1) / weights.sum(1)[..., None]
    return out.to(q.dtype)


class TorchNativeAttnBackend(AttentionBackend):
    def __init__(self, use_decode_kernel: bool = True):
        self.forward_metadata = None
        # Eager CPU decode on the C++ kernel where it is built (cpu_decode.py); False keeps gather + SDPA, the
        # path it replaces (bench/decode_attention.py times both).
        self.use_decode_kernel = use_decode_kernel
        self._buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def _workspace(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A reusable buffer of at least ``shape``; grows when a batch needs more, never shrinks."""
        numel = math.prod(shape)
        buffer = self._buffers.get((name, dtype))
        if buffer is None or buffer.numel() < numel:
            device = self.forward_metadata.kv_indices.device
            buffer = self._buffers[(name, dtype)] = torch.empty(numel, dtype=dtype, device=device)
        return buffer[:numel].view(shape)

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        if forward_batch.forward_mode.is_decode():
            self.forward_metadata = self.decode_metadata(forward_batch)
            return
        req_to_token, rows = forward_batch.req_to_token_pool.req_to_token, forward_batch.req_pool_indices
        kv_indices, masks, q_slices, start = [], [], [], 0
        seq_lens = forward_batch.seq_lens_cpu.tolist()
        for i, (prefix_len, extend_len) in enumerate(
            zip(forward_batch.extend_prefix_lens_cpu, forward_batch.extend_seq_lens_cpu)
        ):
            kv_indices.append(req_to_token[rows[i], : seq_lens[i]])
            # Query j (absolute position prefix_len + j) may see keys 0..prefix_len + j.
            mask = None
            if prefix_len:
                mask = torch.ones(extend_len, seq_lens[i], dtype=torch.bool, device=rows.device).tril(prefix_len)
            masks.append(mask)
            q_slices.append(slice(start, start + extend_len))
            start += extend_len
        prefix_lens, extend_lens = forward_batch.extend_prefix_lens_cpu, forward_batch.extend_seq_lens_cpu
        rectangular = not any(prefix_lens) and len(set(extend_lens)) == 1
        self.forward_metadata = ExtendMetadata(kv_indices, masks, q_slices, rectangular)

    def init_forward_metadata_out_graph(self, forward_batch: ForwardBatch) -> None:
        """The metadata a compiled forward reads: a decode's positions padded to ``DECODE_POSITION_BLOCK``, whole
        blocks for ``fused_decode_attention``'s blocked V sum. Eager decodes keep their exact lengths, where a
        padded position would cost SDPA a mask."""
        if forward_batch.forward_mode.is_decode():
            # At least two blocks: traced with one, dynamo specializes the graph to one block, and the first decode
            # past DECODE_POSITION_BLOCK positions would compile the model again.
            self.forward_metadata = self.decode_metadata(forward_batch, DECODE_POSITION_BLOCK, min_blocks=2)
            return
        self.init_forward_metadata(forward_batch)

    @staticmethod
    def decode_metadata(forward_batch: ForwardBatch, position_block: int = 1, min_blocks: int = 1) -> DecodeMetadata:
        """Each request's KV slots, up to the longest sequence rounded up to whole blocks of ``position_block``
        positions (at least ``min_blocks``).

        The gathered table and its mask serve every layer, so they are built once per step. Padding positions
        point at slot 0 and are masked out.
        """
        rows, seq_lens = forward_batch.req_pool_indices, forward_batch.seq_lens
        max_len = int(forward_batch.seq_lens_cpu.max())
        padded_len = max(-(-max_len // position_block), min_blocks) * position_block
        slots = F.pad(forward_batch.req_to_token_pool.req_to_token[rows, :max_len], (0, padded_len - max_len))
        valid = torch.arange(padded_len, device=rows.device) < seq_lens[:, None]
        ragged = int(forward_batch.seq_lens_cpu.min()) != padded_len
        return DecodeMetadata(torch.where(valid, slots, 0), valid, ragged)

    def forward_extend(self, q, k, v, layer: RadixAttention, forward_batch: ForwardBatch) -> torch.Tensor:
        pool = forward_batch.token_to_kv_pool
        pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        buffers = pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)
        meta: ExtendMetadata = self.forward_metadata
        q = q.view(-1, layer.tp_q_head_num, layer.head_dim)
        if meta.rectangular:
            # Requests of one length with nothing cached attend in one attention call over [requests, tokens, ...]
            # views of q, k, v: no gather, no loop (SmolLM2 bfloat16 attention at 8x128: 4.4 -> 3.8 ms per layer).
            requests = len(meta.q_slices)
            q, k, v = (x.view(requests, -1, *x.shape[1:]) for x in (q, k, v))
            return self._attend(q, k, v, None, layer.scaling).reshape(-1, layer.tp_q_head_num * layer.head_dim)
        if len(meta.q_slices) == 1:
            # No row slicing for a single request (always so when traced, see RadixAttention): its length stays
            # symbolic in a compiled graph.
            out = self._attend_request(q, k, v, buffers, meta.kv_indices[0], meta.masks[0], layer.scaling)
        else:
            out = torch.empty_like(q)
            for kv_idx, mask, rows in zip(meta.kv_indices, meta.masks, meta.q_slices):
                out[rows] = self._attend_request(q[rows], k[rows], v[rows], buffers, kv_idx, mask, layer.scaling)
        return out.reshape(-1, layer.tp_q_head_num * layer.head_dim)

    def _attend_request(self, q, k, v, buffers: tuple[torch.Tensor, torch.Tensor], kv_idx, mask, scale: float):
        """One request's extend attention: q, k, v ``[tokens, heads, head_dim]``; its K/V slots ``kv_idx``.

        Without a cached prefix (``mask`` None) its keys are exactly its new k and v, so nothing is gathered,
        as SGLang's FlashInfer backend attends a batch without prefixes on the ragged new K/V.
        """
        if mask is not None:
            k, v = buffers[0].index_select(0, kv_idx), buffers[1].index_select(0, kv_idx)
        return self._attend(q[None], k[None], v[None], mask, scale)[0]

    @staticmethod
    def _attend(q, k, v, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
        """Attention over requests laid out ``[requests, tokens, heads, head_dim]``; causal when there is no mask.

        SDPA wants heads before tokens: the transposes are views. CPU SDPA takes its flash kernel only for
        4-D inputs (3-D falls back to the math path, 2-2.5x slower here). Causal work goes to minisgl's C++
        kernel on CPU (``cpu_prefill.py``), else to ``causal_prefill_attention`` where that is faster
        (``prefers_tiles``).
        """
        if mask is None and uses_prefill_kernel(q):
            return causal_prefill_attention_cpu(q, k, v, scale)
        if mask is None and prefers_tiles(q, k):
            return causal_prefill_attention(q, k, v, scale)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask,
            is_causal=mask is None,
            scale=scale,
            enable_gqa=True,
        )
        return out.transpose(1, 2)

    def _gather(self, name: str, source: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        # Into buffers kept across layers and steps: a fresh tensor of this size per layer costs page faults
        # (measured alone at batch 32: 18 ms -> 11 ms per layer). index_select on a flat index is also
        # several times faster than advanced indexing on CPU.
        out = self._workspace(name, (index.numel(), *source.shape[1:]), source.dtype)
        return torch.index_select(source, 0, index.flatten(), out=out)

    def _gather_kv(
        self, buffers: tuple[torch.Tensor, torch.Tensor], index: torch.Tensor, head_major: bool, upcast: bool
    ) -> list[torch.Tensor]:
        """K and V of the requests in ``index``, as ``[requests, kv_heads, seq_len, head_dim]``."""
        requests, seq_len = index.shape[0], index.shape[-1]
        gathered = []
        for name, buffer in zip("kv", buffers):
            kv_heads, head_dim = buffer.shape[1:]
            rows = self._gather(name, buffer.view(-1, head_dim) if head_major else buffer, index)
            if head_major:
                gathered.append(rows.view(requests, kv_heads, seq_len, head_dim))
                continue
            rows = rows.view(requests, seq_len, kv_heads, head_dim).transpose(1, 2)
            if upcast:  # the copy also puts heads before tokens: SDPA reads contiguous [seq_len, head_dim] blocks
                rows = self._workspace(name + "32", rows.shape, torch.float32).copy_(rows)
            gathered.append(rows)
        return gathered

    def forward_decode(self, q, k, v, layer: RadixAttention, forward_batch: ForwardBatch) -> torch.Tensor:
        pool = forward_batch.token_to_kv_pool
        meta: DecodeMetadata = self.forward_metadata
        (batch, seq_len), kv_heads, head_dim = meta.kv_indices.shape, layer.tp_k_head_num, layer.head_dim
        if not torch.compiler.is_compiling() and self.use_decode_kernel and uses_decode_kernel(q):
            # The pool read in place by one C++ kernel, which first writes this step's K/V into it.
            out = decode_attention_cpu(
                q.view(batch, layer.tp_q_head_num, head_dim),
                pool.get_key_buffer(layer.layer_id),
                pool.get_value_buffer(layer.layer_id),
                meta.kv_indices,
                forward_batch.seq_lens,
                layer.scaling,
                (k, v, forward_batch.out_cache_loc),
            )
            return out.view(batch, -1)
        pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        buffers = pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)
        # The query heads that share a KV head become that head's query rows, so each K/V block is read once
        # per group of heads instead of once per head.
        group = layer.tp_q_head_num // kv_heads
        queries = q.view(-1, kv_heads, group, head_dim)
        if torch.compiler.is_compiling():
            # Traced into the compiled forward, decode attention costs no custom-op call, no Python and no
            # gathered copy per layer (SmolLM2 decode, ms/step: float32 batch 1 25.1 -> 20.1, batch 8
            # 41.3 -> 33.2; bfloat16 batch 1 21.2 -> 14.6, batch 32 63.2 -> 52.4), and the K/V write above
            # fuses into the same kernel, in place in the pool.
            # Only the real requests attend: the metadata leaves out CPUGraphRunner's padding rows, which would
            # each scan the whole (masked) sequence; theirs is a zero output. SmolLM2 float32 at batch 1, in-process
            # A/B, ms/step: 15.5 -> 14.8 at 128 tokens, 18.8 -> 16.1 at 512, 31.0 -> 21.9 at 2048.
            out = fused_decode_attention(queries[:batch], *buffers, meta.kv_indices, meta.valid, layer.scaling)
            return F.pad(out.reshape(batch, -1), (0, 0, 0, q.shape[0] - batch))
        on_cpu, half = q.device.type == "cpu", buffers[0].dtype != torch.float32
        # CPU SDPA's 16-bit kernel is fast for several query rows on contiguous [seq, head_dim] blocks (grouped
        # heads; SmolLM2 bf16 batch 32: 133 -> 100 ms/step) and slow for one query row, where float32 is faster,
        # upcast copy included. With several rows, 16-bit K/V are gathered head by head, so the gather and SDPA
        # both split their work by head across threads and each core reads back the rows it wrote (gathered token
        # by token, dummy134 bf16 batch 32 once swung between ~100 and ~200 ms/step from run to run). With one
        # row, whole tokens are gathered (runs of contiguous slots copy as blocks) and the upcast copy puts heads
        # first (dummy134 bf16, in-process A/B against gathering head by head, ms/step: 32x256 51.7 -> 44.0, four
        # more runs alike, one even at 58-60; 8x128 15.1 -> 14.3, 1x512 10.1 -> 9.8).
        upcast = on_cpu and half and group == 1
        head_major = on_cpu and half and not upcast
        index = meta.get_head_major_rows(kv_heads) if head_major else meta.kv_indices
        # On CPU, requests are attended a few at a time so that the K/V gathered for them are still in cache when
        # SDPA reads them; a whole large batch's gather goes out to memory and back (dummy134 bf16 batch 32:
        # 154 -> 92 ms/step of attention).
        request_bytes = 2 * seq_len * kv_heads * head_dim * (buffers[0].element_size() + 4 * upcast)
        chunk = max(1, _CACHE_BLOCK_BYTES // request_bytes) if on_cpu else batch
        outs = []
        for start in range(0, batch, chunk):
            rows = slice(start, start + chunk)
            keys, values = self._gather_kv(buffers, index[rows], head_major, upcast)
            mask = meta.valid[rows, None, None, :] if meta.ragged else None
            outs.append(
                F.scaled_dot_product_attention(
                    queries[rows].to(keys.dtype), keys, values, attn_mask=mask, scale=layer.scaling
                )
            )
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        return out.to(q.dtype).reshape(batch, layer.tp_q_head_num * head_dim)
