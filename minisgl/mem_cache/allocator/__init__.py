from minisgl.mem_cache.allocator.token import TokenToKVPoolAllocator

__all__ = ["TokenToKVPoolAllocator"]
