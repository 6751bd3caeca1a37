"""Allocation for a batch: request rows and KV slots, recorded in ``req_to_token``.

SGLang's ``mem_cache/common.py`` does the same with a tree cache in the loop: it evicts radix-cache
nodes when slots run short, supports paged and SWA allocation, and writes ``req_to_token`` with a Triton
kernel. minisgl has no prefix cache to evict from, so running short is an error that says what to change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minisgl.utils.common import InputError

if TYPE_CHECKING:
    from minisgl.managers.schedule_batch import ScheduleBatch


class OutOfKVCacheError(InputError):
    """The pools cannot hold the batch; the message names the capacity and the flags that change it."""


def alloc_token_slots(batch: ScheduleBatch, num_tokens: int) -> torch.Tensor:
    allocator = batch.token_to_kv_pool_allocator
    out_cache_loc = allocator.alloc(num_tokens)
    if out_cache_loc is None:
        raise OutOfKVCacheError(
            f"out of KV cache: {num_tokens} token slots needed, {allocator.available_size()} free of "
            f"{allocator.size}; lower --batch-size or the lengths, or raise --max-total-tokens"
        )
    return out_cache_loc


def alloc_req_slots(batch: ScheduleBatch) -> None:
    """Give each request without one a ``req_to_token`` row; a request extending its cached prefix keeps its own."""
    new_reqs = [req for req in batch.reqs if req.req_pool_idx is None]
    rows = batch.req_to_token_pool.alloc(len(new_reqs))
    if rows is None:
        raise OutOfKVCacheError(
            f"out of request slots: {len(new_reqs)} needed, {batch.req_to_token_pool.available_size()} free; "
            "lower --batch-size"
        )
    for req, row in zip(new_reqs, rows):
        req.req_pool_idx = row


def alloc_for_extend(batch: ScheduleBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate rows and slots for the tokens to extend; write prefix and new slots into ``req_to_token``.

    Returns ``(out_cache_loc, req_pool_indices)``: the new tokens' slots, in batch order, and the rows.
    """
    alloc_req_slots(batch)
    out_cache_loc = alloc_token_slots(batch, sum(batch.extend_lens))
    req_to_token = batch.req_to_token_pool.req_to_token
    start = 0
    for req, prefix_len, extend_len in zip(batch.reqs, batch.prefix_lens, batch.extend_lens):
        row = req_to_token[req.req_pool_idx]
        row[:prefix_len] = req.prefix_indices.to(row)
        row[prefix_len : prefix_len + extend_len] = out_cache_loc[start : start + extend_len].to(row)
        start += extend_len
    req_pool_indices = torch.tensor([req.req_pool_idx for req in batch.reqs], dtype=torch.int64)
    return out_cache_loc, req_pool_indices.to(batch.device)


def alloc_for_decode(batch: ScheduleBatch, token_per_req: int) -> torch.Tensor:
    """One new slot per request, recorded at position ``seq_len`` of its row (before seq_lens grows)."""
    out_cache_loc = alloc_token_slots(batch, len(batch.reqs) * token_per_req)
    batch.req_to_token_pool.req_to_token[batch.req_pool_indices, batch.seq_lens] = out_cache_loc.to(torch.int32)
    return out_cache_loc
