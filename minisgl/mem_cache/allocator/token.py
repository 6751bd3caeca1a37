"""TokenToKVPoolAllocator: hands out KV slots one token at a time (page size 1).

SGLang's ``allocator/token.py`` has the same free-list design; its siblings add paging
(``PagedTokenToKVPoolAllocator``), SWA and mamba allocators, grouped frees and state backup for
speculative decoding.
"""

from __future__ import annotations

import torch


class TokenToKVPoolAllocator:
    """A free list of slots ``1..size``; slot 0 stays reserved as the padding slot of the KV pool."""

    def __init__(self, size: int, device: torch.device):
        self.size = size
        self.device = device
        self.clear()

    def clear(self) -> None:
        self.free_pages = torch.arange(1, self.size + 1, dtype=torch.int64, device=self.device)

    def available_size(self) -> int:
        return len(self.free_pages)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """Take ``need_size`` slots from the head of the free list, or None if too few are free."""
        if need_size > len(self.free_pages):
            return None
        select, self.free_pages = self.free_pages[:need_size], self.free_pages[need_size:]
        return select

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel():
            self.free_pages = torch.cat((self.free_pages, free_index.to(self.free_pages)))
