"""Two memory pools: request rows to KV slots (``ReqToTokenPool``) and the KV storage itself.

A request's K/V do not live in one contiguous tensor. Each token gets a *slot* in ``MHATokenToKVPool``
(handed out by ``TokenToKVPoolAllocator``), and ``ReqToTokenPool.req_to_token[row, pos]`` records which
slot holds position ``pos`` of the request in ``row``. Attention reads a request's K/V by gathering its
row. That indirection is what lets a later extend reuse a cached prefix without copying it.

SGLang's ``memory_pool.py`` (``sglang/srt/mem_cache/``) adds hybrid/mamba pools, MLA, FP4/FP8 KV, SWA,
host offload and Triton kernels to move KV; the layout and the slot-0 padding convention are the same.
"""

from __future__ import annotations

import torch


class ReqToTokenPool:
    """``req_to_token[row, pos]`` = KV slot of token ``pos`` of the request that holds ``row``.

    Row 0 is never handed out, as in SGLang, so a zeroed ``req_pool_idx`` always points at padding.
    """

    def __init__(self, size: int, max_context_len: int, device: torch.device):
        self.size = size
        self.max_context_len = max_context_len
        self.device = device
        self.req_to_token = torch.zeros((size + 1, max_context_len), dtype=torch.int32, device=device)
        self.free_slots: list[int] = list(range(1, size + 1))

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, need_size: int) -> list[int] | None:
        """Take ``need_size`` free rows, or None when there are not enough (the caller reports it)."""
        if need_size > len(self.free_slots):
            return None
        taken, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        return taken

    def free(self, free_index: int | list[int]) -> None:
        self.free_slots.extend([free_index] if isinstance(free_index, int) else free_index)

    def clear(self) -> None:
        self.free_slots = list(range(1, self.size + 1))


class MHATokenToKVPool:
    """Per-layer K and V buffers of shape ``[size + 1, kv_heads, head_dim]``; slot 0 is padding."""

    def __init__(
        self, size: int, dtype: torch.dtype, head_num: int, head_dim: int, layer_num: int, device: torch.device
    ):
        self.size = size
        self.dtype = dtype
        self.device = device
        shape = (size + 1, head_num, head_dim)
        # Zero-filled so that a gather of an unwritten slot yields 0, never a NaN that survives masking.
        self.k_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layer_num)]
        self.v_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layer_num)]

    @staticmethod
    def get_cell_size_per_token(head_num: int, head_dim: int, layer_num: int, dtype: torch.dtype) -> int:
        """Bytes one token's K and V take across all layers: what the memory budget is divided by."""
        return 2 * head_num * head_dim * layer_num * torch.finfo(dtype).bits // 8

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[layer_id]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor) -> None:
        """Write the new tokens' K/V in place at their slots (no concatenation, no reallocation)."""
        self.k_buffer[layer_id][loc] = cache_k.to(self.dtype)
        self.v_buffer[layer_id][loc] = cache_v.to(self.dtype)
