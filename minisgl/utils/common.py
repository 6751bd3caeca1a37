"""Small helpers shared by the runtime.

SGLang's counterpart, ``sglang/srt/utils/common.py``, is a grab bag of several thousand lines (process
trees, NUMA, CUDA-graph helpers, ...). minisgl keeps only what its bench path needs: one error type for
bad user input, device resolution and a memory probe.
"""

from __future__ import annotations

import os
from pathlib import Path

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


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels, so a timer around a step measures the step (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
