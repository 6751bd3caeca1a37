"""CPU causal prefill attention as one C++ kernel (``csrc/prefill.cpp``), built with minisgl's other CPU kernels.

An extend with nothing cached (every prompt of a prefill, and ``bench_one_batch``'s) attends its own new keys and
values causally. CPU SDPA's flash kernel multiplies its blocks at about a third of an AVX-512 CPU's float32 peak,
and ``causal_prefill_attention`` (``tiled_prefill.py``) on oneDNN's batched matmul pays a call per query tile. The
kernel splits the work into (request, KV head, 16 or more tokens) units, each scoring its query rows (the tokens' heads
that share the KV head) only against the keys up to its last token, from keys transposed once per KV head. Alone,
causal attention of one layer, us (2-core AMD EPYC Zen 5, AVX-512), SDPA / tiles / kernel: SmolLM2's heads float32
1x128 291 / 236 / 110, 1x512 3888 / 1762 / 1109, 8x128 2152 / 1404 / 764; bfloat16 1x128 330 / 264 / 99;
dummy134's float32 1x128 385 / 311 / 149, 8x128 3397 / 3145 / 1460 (``bench/prefill_attention.py``;
``bench/prefill_levers.py`` times the whole prefill).

It computes in float32 (16-bit inputs are widened), as SDPA and the tiles do. Where the kernels cannot be built,
on CPUs with AMX (whose tiles SDPA's flash kernel multiplies bfloat16 blocks on), for head sizes the kernel does
not block for, and past ``MAX_TOKENS`` tokens per request, prefill keeps the tiles or SDPA. SGLang's CPU backend
(``intel_amx_backend.py``) calls sgl-kernel's ``extend_attention_cpu``, which also reads a cached prefix from the
paged pool, and multiplies 16-bit blocks with AVX512-BF16 and AMX.
"""

from __future__ import annotations

import torch

from minisgl.layers.cpu_kernels import KERNEL_DTYPES, cpu_kernels_built

MAX_TOKENS = 4096  # the kernel's kMaxTokens: a unit's scores are held whole
HEAD_DIM_MULTIPLE = 64  # the kernel's head_dim block (four AVX-512 vectors); 64 and 128, Llama's and Qwen's, fit


@torch.compiler.assume_constant_result
def prefill_kernel_built() -> bool:
    """Whether the kernel is built and loaded, a constant to a compiled graph: traced, ``cpu_kernels_built``'s body
    (a compiler probe and a build) would be inlined."""
    return cpu_kernels_built() and not torch.cpu._is_amx_tile_supported()


def uses_prefill_kernel(q: torch.Tensor) -> bool:
    """Whether causal attention of q ``[requests, tokens, heads, head_dim]`` with nothing cached runs the kernel: on
    CPU, in ``KERNEL_DTYPES``, ``head_dim`` a multiple of ``HEAD_DIM_MULTIPLE``, at most ``MAX_TOKENS`` tokens, built
    and without AMX. The length is checked last, so that a compiled graph guards on it only where it decides."""
    if q.device.type != "cpu" or q.dtype not in KERNEL_DTYPES or q.shape[-1] % HEAD_DIM_MULTIPLE:
        return False
    return prefill_kernel_built() and q.shape[1] <= MAX_TOKENS


def causal_prefill_attention_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of requests with nothing cached: q ``[requests, tokens, heads, head_dim]``, k and v
    ``[requests, tokens, kv_heads, head_dim]`` (heads sharing a KV head in groups; views with ``head_dim``
    contiguous, as split from the QKV projection). Returns a contiguous tensor of q's shape and dtype.
    ``uses_prefill_kernel(q)`` answered True first."""
    return torch.ops.minisgl_cpu.causal_prefill_attention(q, k, v, scale)
