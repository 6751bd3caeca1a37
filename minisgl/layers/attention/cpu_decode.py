"""CPU decode attention as one C++ kernel over the paged pool (``csrc/decode.cpp``), built when a model loads.

Eager decode on CPU otherwise gathers each request's K/V into a contiguous copy and runs SDPA on it: two passes
over the K/V and 23 top-level aten calls per layer, K/V write included, against the kernel path's 7 (torch
profiler, SmolLM2's heads at 8x128, both dtypes). The kernel reads the pool in place through ``kv_indices``,
splits long requests into chunks of positions across threads and combines them (flash-decoding's split). In-process
A/B of one eager engine, gather + SDPA against the kernel, float32, ms/step (median of 7): dummy134 8x128 41.9 ->
36.6, 1x512 27.7 -> 23.3; SmolLM2 8x128 58.6 -> 52.1, 1x128 39.3 -> 35.7; bfloat16, dummy134 8x128 46.0 -> 37.6,
1x512 22.3 -> 18.9; SmolLM2 (grouped heads, where SDPA's 16-bit kernel gets several query rows) even, 8x128 58.2
vs 59.1, 32x256 121.6 vs 120.9. A compiled decode keeps ``fused_decode_attention`` (Inductor's, traced into the
step's graph): the kernel called from the graph measured within noise of it (SmolLM2 float32 1x512 15.9 vs 15.9
ms/step, 8x128 39.4 vs 38.3).

It is built with minisgl's other C++ CPU kernels (``cpu_kernels.py``); where they cannot be built, decode attention
stays on gather + SDPA.

The kernel also writes the step's new K/V into the pool, in place of ``set_kv_buffer``'s two ``index_put`` calls per
layer. SGLang's CPU backend (``intel_amx_backend.py``) calls sgl-kernel's prebuilt ``decode_attention_cpu`` likewise,
which writes the new K/V too and has AMX paths.
"""

from __future__ import annotations

import torch

from minisgl.layers.cpu_kernels import KERNEL_DTYPES, cpu_kernels_built


def decode_attention_op():
    """``torch.ops.minisgl_cpu.decode_attention``, built and loaded once per process; None where it cannot be."""
    return torch.ops.minisgl_cpu.decode_attention if cpu_kernels_built() else None


def uses_decode_kernel(q: torch.Tensor) -> bool:
    """Whether an eager decode of ``q`` runs the kernel: on CPU, in ``KERNEL_DTYPES`` (measured faster than
    gather + SDPA, or even, above), and built."""
    return q.device.type == "cpu" and q.dtype in KERNEL_DTYPES and decode_attention_op() is not None


def decode_attention_cpu(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    kv_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    new_kv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Attention of each request's one query row over its first ``seq_lens[i]`` slots in ``kv_indices[i]``.

    q ``[batch, heads, head_dim]``; k_buffer, v_buffer ``[slots, kv_heads, head_dim]`` (a layer's pool, heads
    sharing a KV head in groups); kv_indices int32 ``[batch, >= max(seq_lens)]``. ``new_kv``, the step's
    ``(key, value, loc)`` (``[batch, kv_heads, head_dim]`` each, int64 slots), is written into the pools first, as
    ``set_kv_buffer`` would. Returns q's shape and dtype.
    The op must be loaded: ``uses_decode_kernel`` answered True (``decode_attention_op`` returned the op) first.
    """
    key, value, loc = new_kv if new_kv is not None else (None, None, None)
    return torch.ops.minisgl_cpu.decode_attention(q, k_buffer, v_buffer, key, value, loc, kv_indices, seq_lens, scale)
