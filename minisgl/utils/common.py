"""Small helpers shared by the runtime.

SGLang's counterpart, ``sglang/srt/utils/common.py``, is a grab bag of several thousand lines (process
trees, NUMA, CUDA-graph helpers, ...). minisgl keeps only what its bench path needs: one error type for
bad user input, device resolution, a memory probe and glibc's allocator settings for CPU runs.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

import torch


class InputError(Exception):
    """Bad user input (a flag, a path, a prompt). The CLI prints it as one line and exits with code 2.

    Every message says what is wrong and how to fix it; nothing below the CLI prints a traceback for it.
    """


def cache_dir() -> Path:
    """Where downloads are kept (default model, SGLang source, site assets): ``$MINISGL_CACHE`` or ~/.cache/minisgl."""
    return Path(os.environ.get("MINISGL_CACHE", Path.home() / ".cache" / "minisgl"))


def resolve_device(device: str) -> torch.device:
    """Turn ``--device`` (cpu, cuda, cuda:N) into a torch device, refusing CUDA when it is absent."""
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise InputError(f"--device {device}: no CUDA device is visible here; use --device cpu")
        name, _, index = device.partition(":")
        if device != "cuda" and not (name == "cuda" and index.isdigit()):
            raise InputError(f"--device {device} is not a device; use cuda or cuda:N")
        if index and int(index) >= torch.cuda.device_count():
            raise InputError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return torch.device(device)
    if device != "cpu":
        raise InputError(f"--device {device} is not supported; use cpu or cuda")
    return torch.device("cpu")


def get_available_memory(device: torch.device) -> int:
    """Free bytes on ``device`` now: the CUDA allocator's view, or the OS's available RAM on CPU."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def write_whole(path: str, write: Callable[[IO], None], binary: bool = False) -> None:
    """Have ``write`` fill a temporary file beside ``path``, then rename it over ``path``: an interrupted write
    leaves the old file (or none), never a truncated one. The file gets the permissions ``open`` would give it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
        os.umask(umask := os.umask(0))
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 -> what open() would have given
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels, so a timer around a step measures the step (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# glibc's mallopt parameters (<malloc.h>), and the largest mmap threshold it accepts on 64-bit systems.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_MAX = 32 << 20
_TRIM_THRESHOLD = 1 << 30


# Set by a user who tunes glibc's malloc already (or who preloads another allocator and says so): left alone.
USER_MALLOC_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


@functools.cache
def keep_freed_cpu_memory() -> bool:
    """Have glibc's malloc hand freed activation blocks back out instead of returning them to the OS.

    By default glibc maps every block above a threshold (128 KiB, raised up to 32 MiB as mapped blocks are
    freed) afresh, and trims a heap whenever the free space at its top passes twice that. A forward's large
    activations then come back as new pages, which the kernel allocates and zeroes on first touch: SmolLM2 eager
    bfloat16 prefill at 32x256 took ~270k-840k page faults per run (1.1-3.4 GB). Blocks up to glibc's limit of
    32 MiB now always come from a heap, and each heap (one per thread arena) keeps up to 1 GiB of free space at
    its top for reuse; larger blocks are still mapped afresh every time. Set once per process, for the whole
    process (a library run beside minisgl in it gets it too; ``bench/perf.py`` runs HF in a process of its own, under
    glibc's defaults); skipped where
    ``MINISGL_KEEP_FREED_CPU_MEMORY=0`` or glibc's own variables (``USER_MALLOC_SETTINGS``) are set.
    Returns whether mallopt accepted the settings (False when skipped or under another C library; an allocator
    preloaded over glibc's may accept them and ignore them). SGLang's CPU guide instead preloads tcmalloc or
    TBB's malloc with ``LD_PRELOAD`` (see ``CpuDeviceMixin.empty_cache`` in ``sglang/srt/platforms/cpu.py``),
    which needs a launcher; these are glibc's own knobs, set in-process.
    """
    opted_out = os.environ.get("MINISGL_KEEP_FREED_CPU_MEMORY") == "0"
    if opted_out or any(map(os.environ.get, USER_MALLOC_SETTINGS)) or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)  # the C library this process already runs on
    settings = ((_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX), (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
    accepted = [libc.mallopt(parameter, value) == 1 for parameter, value in settings]  # both tried, even if one fails
    return all(accepted)
