"""torch.profiler helpers for the bench: start, stop, save a gzipped Chrome trace and print the top ops.

Trace names follow SGLang's ``_create_torch_profiler_filename``; the directory comes from
``$MINISGL_TORCH_PROFILER_DIR`` (SGLang: ``$SGLANG_TORCH_PROFILER_DIR``), default the system temp dir.
SGLang also drives the CUDA profiler for nsys and Apple's Metal capture.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence

import torch


def get_torch_profiler_output_dir() -> str:
    return os.environ.get("MINISGL_TORCH_PROFILER_DIR", tempfile.gettempdir())


def create_torch_profiler_filename(prefix: str, batch_size: int, input_len: int, output_len: int, stage: str) -> str:
    name = f"{prefix}_batch{batch_size}_input{input_len}_output{output_len}_{stage}.trace.json.gz"
    return os.path.join(get_torch_profiler_output_dir(), name)


def start_profile(activities: Sequence[str], record_shapes: bool = False) -> torch.profiler.profile:
    kinds = [torch.profiler.ProfilerActivity.CPU] if "CPU" in activities else []
    if "GPU" in activities and torch.cuda.is_available():
        kinds.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=kinds, with_stack=True, record_shapes=record_shapes)
    profiler.start()
    return profiler


def stop_profile(
    profiler: torch.profiler.profile, activities: Sequence[str], rank_print: Callable, trace_filename: str, stage: str
) -> None:
    profiler.stop()
    # Export under a temporary name and rename, so a crash never leaves a truncated trace behind.
    tmp = f"{trace_filename}.tmp.json.gz"
    profiler.export_chrome_trace(tmp)
    os.replace(tmp, trace_filename)
    rank_print(f"torch profiler chrome trace for {stage} saved to {trace_filename}")
    sort_by = "self_cuda_time_total" if "GPU" in activities and torch.cuda.is_available() else "self_cpu_time_total"
    rank_print(profiler.key_averages(group_by_input_shape=True).table(sort_by=sort_by, row_limit=15))
