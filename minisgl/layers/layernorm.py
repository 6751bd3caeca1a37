"""RMSNorm with SGLang's fused residual add: ``norm(x, residual)`` returns ``(normed, x + residual)``.

Computed in float32 and cast back before the weight, exactly as HF transformers does, so float32 and
bfloat16 results match HF. SGLang dispatches to fused CUDA/Triton/AMX kernels for the same math.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is not None:
            x = x + residual
            residual = x
        h = F.rms_norm(x.float(), x.shape[-1:], eps=self.variance_epsilon)
        out = self.weight * h.to(x.dtype)
        return out if residual is None else (out, residual)
