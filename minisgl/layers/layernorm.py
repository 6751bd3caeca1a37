"""RMSNorm with SGLang's fused residual add: ``norm(x, residual)`` returns ``(normed, x + residual)``, the sum
written into ``residual`` in place (as SGLang's ``fused_add_rmsnorm`` does).

Computed in float32 and cast back before the weight, rounding where HF transformers rounds, so float32 and bfloat16
results match HF. Eagerly on CPU it is one C++ kernel (``csrc/norm.cpp``); traced, on CUDA, or where the kernels
cannot be built, aten's ops (which the compiler fuses). SGLang dispatches to fused CUDA/Triton/AMX kernels for the
same math.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.layers.cpu_kernels import uses_cpu_kernels


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if uses_cpu_kernels(x):
            # One pass per row instead of aten's eight kernels, which at decode cost more to launch than they
            # compute (SmolLM2 float32 decode at batch 1: 61 norms of ~75 us each per step).
            if residual is None:
                return torch.ops.minisgl_cpu.rmsnorm(x, self.weight, self.variance_epsilon)
            return torch.ops.minisgl_cpu.fused_add_rmsnorm(x, residual, self.weight, self.variance_epsilon), residual
        # The residual add and the weight multiply run in place, as SGLang's fused_add_rmsnorm updates its
        # inputs: a fresh activation-sized tensor costs page faults at prefill (SmolLM2 float32 eager prefill,
        # with SiluAndMul's in-place silu: 8x128 1.50-1.79 -> 1.25-1.45 s, 32x64 3.03-3.30 -> 2.80-2.84 s).
        if residual is not None:
            x = residual.add_(x)
            residual = x
        h = F.rms_norm(x.float(), x.shape[-1:], eps=self.variance_epsilon)
        out = h.to(x.dtype).mul_(self.weight)  # h is fresh; weights share the activations' dtype
        return out if residual is None else (out, residual)
