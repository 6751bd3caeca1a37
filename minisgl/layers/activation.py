"""SiluAndMul: ``silu(gate) * up`` on the fused gate_up output, which it overwrites (SGLang uses a fused kernel on
GPUs)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        # silu in place on the gate half of the (temporary) gate_up output: one activation-sized tensor fewer.
        return torch.mul(F.silu(gate, inplace=True), up)
