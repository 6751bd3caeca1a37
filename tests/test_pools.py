"""Property tests of the KV-slot allocator and the request pool against a naive model of free slots; the CPU
heap's reuse of freed activation blocks, counted in the kernel's page faults."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl.mem_cache.allocator import TokenToKVPoolAllocator
from minisgl.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from minisgl.utils.common import USER_MALLOC_SETTINGS

ops = st.lists(st.tuples(st.sampled_from(["alloc", "free"]), st.integers(0, 40)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 64), operations=ops)
def test_allocator_never_hands_out_a_slot_twice(size, operations):
    allocator = TokenToKVPoolAllocator(size, torch.device("cpu"))
    held: list[torch.Tensor] = []
    for op, n in operations:
        in_use = sum(len(t) for t in held)
        if op == "alloc":
            got = allocator.alloc(n)
            if n > size - in_use:
                assert got is None  # exhaustion is reported, nothing is handed out
                continue
            assert got is not None and len(got) == n
            held.append(got)
        elif held:
            allocator.free(held.pop(n % len(held)))
        slots = torch.cat(held).tolist() if held else []
        assert len(slots) == len(set(slots)), "a slot is held twice"
        assert all(1 <= s <= size for s in slots), "slot 0 is padding and must never be handed out"
        assert allocator.available_size() == size - len(slots)
    for t in held:
        allocator.free(t)
    assert sorted(allocator.free_pages.tolist()) == list(range(1, size + 1)), "freed slots come back"


@settings(max_examples=100, deadline=None)
@given(size=st.integers(1, 16), requests=st.lists(st.integers(0, 8), max_size=20))
def test_req_to_token_pool_rows(size, requests):
    pool = ReqToTokenPool(size, 4, torch.device("cpu"))
    held: list[int] = []
    for n in requests:
        rows = pool.alloc(n)
        if n > size - len(held):
            assert rows is None
            pool.free(held[: n % (len(held) + 1)])
            held = held[n % (len(held) + 1) :]
            continue
        assert 0 not in rows and not set(rows) & set(held)
        held += rows
    pool.clear()
    assert sorted(pool.free_slots) == list(range(1, size + 1))


def test_kv_pool_writes_in_place_at_slots():
    pool = MHATokenToKVPool(8, torch.float32, head_num=2, head_dim=4, layer_num=3, device=torch.device("cpu"))
    k, v = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    loc = torch.tensor([5, 1, 7])
    before = pool.get_key_buffer(1).data_ptr()
    pool.set_kv_buffer(1, loc, k, v)
    assert pool.get_key_buffer(1).data_ptr() == before
    torch.testing.assert_close(pool.get_key_buffer(1)[loc], k)
    torch.testing.assert_close(pool.get_value_buffer(1)[loc], v)
    assert pool.get_key_buffer(0).abs().sum() == 0 and pool.get_key_buffer(1)[0].abs().sum() == 0


def test_cell_size_counts_k_and_v_of_every_layer():
    assert MHATokenToKVPool.get_cell_size_per_token(3, 64, 30, torch.float32) == 2 * 3 * 64 * 30 * 4
    assert MHATokenToKVPool.get_cell_size_per_token(3, 64, 30, torch.bfloat16) == 2 * 3 * 64 * 30 * 2


def test_exhaustion_raises_clear_error(tiny_llama):
    from minisgl.bench_one_batch import extend
    from minisgl.mem_cache.common import OutOfKVCacheError
    from tests.test_hf_equality import make_reqs, make_runner

    runner = make_runner(tiny_llama, max_total_tokens=20)
    with pytest.raises(OutOfKVCacheError, match=r"out of KV cache: 23 token slots needed, 20 free of 20"):
        extend(make_reqs([[1] * 10, [2] * 13]), runner)


_PAGE_FAULTS = textwrap.dedent("""
    import ctypes, resource, sys, torch
    from minisgl.utils.common import _M_MMAP_THRESHOLD, _M_TRIM_THRESHOLD, keep_freed_cpu_memory

    # Both arms start at glibc's initial thresholds (128 KiB), held: left to itself glibc raises them as blocks
    # are freed, and a keep_freed_cpu_memory that did nothing could then pass on a lucky heap layout.
    took = all(ctypes.CDLL(None).mallopt(p, 128 << 10) == 1 for p in (_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD))
    if sys.argv[1] == "kept":  # before any large block
        took = took and keep_freed_cpu_memory()
    faults = []
    for _ in range(12):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        blocks = [torch.ones(6 << 20) for _ in range(3)]  # 24 MiB each; 72 MiB freed together at a heap's top
        del blocks
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print("RESULT", took, sum(faults[6:]) / 6)  # after the first cycles, which map and grow the heaps
""")


def _faults_per_cycle(variant: str) -> tuple[str, float]:
    skipped = (*USER_MALLOC_SETTINGS, "MINISGL_KEEP_FREED_CPU_MEMORY")  # what would make the function skip
    env = {k: v for k, v in os.environ.items() if k not in skipped}
    run = subprocess.run([sys.executable, "-c", _PAGE_FAULTS, variant], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    took, faults = next(line for line in run.stdout.splitlines() if line.startswith("RESULT")).split()[1:]
    return took, float(faults)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_freed_cpu_blocks_are_reused_without_page_faults():
    # Fresh processes, since the settings are process-wide. The oracle is the kernel's count of page faults. At
    # glibc's initial thresholds, every 24 MiB block is mapped afresh and faulted in (6144 pages of 4 KiB; fewer
    # with transparent huge pages). Left alone, glibc raises its thresholds as blocks are freed, and whether it
    # then still trims depends on what else sits on the heap (under pytest here it stopped faulting after five
    # cycles, outside it did not), so neither arm leaves them alone. With keep_freed_cpu_memory called on top of
    # the held thresholds, the same cycles reuse the heaps' pages; had it set nothing, or only one of the two,
    # they would still fault.
    took_initial, initial = _faults_per_cycle("initial")
    took, kept = _faults_per_cycle("kept")
    assert took_initial == took == "True"
    assert initial >= 10 and kept * 100 < initial, (initial, kept)
