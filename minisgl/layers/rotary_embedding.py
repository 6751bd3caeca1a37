"""Rotary position embedding (neox style, as Llama/Qwen use) with a cached cos/sin table.

The inverse frequencies come from transformers' own RoPE initialisers (default, linear, llama3, yarn;
others are refused), so scaled variants match HF exactly. Eagerly on CPU the rotation is one C++ kernel in place
(``csrc/rope.cpp``); traced, on CUDA, or where the kernels cannot be built, aten's ops. SGLang's ``rotary_embedding/`` package implements each
variant itself, plus mrope, dual-chunk and fused rope+KV-store kernels.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from minisgl.layers.cpu_kernels import uses_cpu_kernels
from minisgl.utils.common import InputError


class RotaryEmbedding(nn.Module):
    def __init__(self, inv_freq: torch.Tensor, max_position: int, scaling: float):
        super().__init__()
        t = torch.arange(max_position, dtype=torch.float32, device=inv_freq.device)
        freqs = torch.outer(t, inv_freq.float())
        # Indexed by position at each forward; one table for all layers.
        self.register_buffer("cos_cached", freqs.cos() * scaling, persistent=False)
        self.register_buffer("sin_cached", freqs.sin() * scaling, persistent=False)
        self._positions, self._positions_version, self._cos_sin = None, None, None

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        if uses_cpu_kernels(q):
            # q and k rotated in place, where aten needs a cos/sin lookup and three kernels per tensor, each longer
            # to launch than a decode token's few heads take; q and k are views into the qkv output, which is fresh.
            torch.ops.minisgl_cpu.rotary_embedding(positions, q, k, self.cos_cached, self.sin_cached)
            return q, k
        if torch.compiler.is_compiling():
            # The compiler fuses the lookup into the rotation; a cache keyed on tensor identity would only add
            # guards that fail (and recompile) at every step.
            cos, sin = self._lookup(positions, q.dtype)
        else:
            # Every layer shares this module and the same positions tensor in one forward: look up cos/sin once.
            # The version counter catches a tensor rewritten in place between forwards (a graph's static buffer).
            if (positions is not self._positions or positions._version != self._positions_version
                    or self._cos_sin[0].dtype != q.dtype):  # fmt: skip
                self._positions, self._cos_sin = positions, self._lookup(positions, q.dtype)
                self._positions_version = positions._version
            cos, sin = self._cos_sin
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def forget_lookup(self) -> None:
        """Drop the looked-up cos/sin, so that the next forward looks them up again (a CUDA graph capture must
        record the lookup, not reuse the warm-up's tensors)."""
        self._positions, self._positions_version, self._cos_sin = None, None, None

    def _lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``[cos, cos]`` and ``[-sin, sin]`` per position, shaped ``[tokens, 1, head_dim]`` for broadcasting."""
        cos, sin = self.cos_cached[positions].unsqueeze(1), self.sin_cached[positions].unsqueeze(1)
        return torch.cat((cos, cos), -1).to(dtype), torch.cat((-sin, sin), -1).to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [tokens, heads, head_dim]; rotates the two halves of head_dim against each other.

    With ``cos = [cos, cos]`` and ``sin = [-sin, sin]`` this is ``x * cos + swap_halves(x) * sin``: three
    kernels instead of the eight of chunk/mul/sub/add/cat, which matters at decode, where each is tiny.
    """
    # Swapping the halves is rolling head_dim by half of it. torch.roll concatenates the two halves in one copy;
    # flip() was the slower kernel (AMD EPYC, us per call: bfloat16 [1024, 9, 64] 117 -> 16, [8, 12, 64] 5.4 -> 2.6).
    return torch.addcmul(x * cos, torch.roll(x, x.shape[-1] // 2, -1), sin)


_ROPE_CACHE: dict[tuple, RotaryEmbedding] = {}


def get_rope(config: PretrainedConfig, head_dim: int, max_position: int) -> RotaryEmbedding:
    """One instance per rope configuration and device, shared by all layers (as SGLang's ``get_rope``)."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    key = (head_dim, max_position, repr(sorted(params.items())), str(torch.get_default_device()))
    if key not in _ROPE_CACHE:
        _ROPE_CACHE[key] = _new_rope(config, params, head_dim, max_position)
    return _ROPE_CACHE[key]


def _new_rope(config: PretrainedConfig, params: dict, head_dim: int, max_position: int) -> RotaryEmbedding:
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
        inv_freq, scaling = 1.0 / (params.get("rope_theta", 10000.0) ** exponents), 1.0
    elif rope_type in ("linear", "llama3", "yarn"):
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config)
    else:
        raise InputError(f"rope_type {rope_type!r} is not supported; minisgl handles default, linear, llama3, yarn")
    return RotaryEmbedding(inv_freq.to(torch.float32), max_position, float(scaling))
