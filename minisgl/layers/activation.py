"""SiluAndMul: ``silu(gate) * up`` on the fused gate_up output. Eagerly on CPU one C++ kernel (``csrc/activation.cpp``);
elsewhere aten's ops, which overwrite the gate half when run eagerly (SGLang uses fused kernels on GPUs and CPUs)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.layers.cpu_kernels import uses_cpu_kernels


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # One pass instead of chunk, silu and mul: three launches, each longer than a decode row takes.
        if uses_cpu_kernels(x):
            return torch.ops.minisgl_cpu.silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        if torch.compiler.is_compiling():
            # Traced, an in-place silu on a view of x becomes a write back into x, and Inductor's fused kernel then
            # builds int64 index masks for every vector to tell the gate half from the rest. Out of place it is one
            # plain loop (compiled, in-process A/B of two engines: SmolLM2 bfloat16 1x512 prefill
            # 234.2 -> 216.0 ms; dummy134 bfloat16 8x128 prefill 313.3 -> 302.9 ms, decode 13.35 -> 12.16 ms/step).
            return F.silu(gate) * up
        # Eagerly, silu in place on the gate half of the (temporary) gate_up output: one activation-sized tensor fewer.
        return torch.mul(F.silu(gate, inplace=True), up)
