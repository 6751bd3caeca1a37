"""Tensor-parallel linear layers with SGLang's names, and their weight loaders.

A column-parallel layer splits its *output* features across ranks (each rank computes a slice, no
communication); a row-parallel layer splits its *input* features and all-reduces the partial sums.
Pairing them (qkv/gate_up column-parallel, o/down row-parallel) costs one all-reduce per block.

Each parameter carries a ``weight_loader`` that takes the *full* checkpoint tensor and copies in only
this rank's shard, so ``load_weights`` is the same loop at any tp size. Every layer multiplies through
``apply_linear``, which with the CPU weight forms it reads (``prepack_linear_weights`` makes them after loading)
lives in ``amx_utils.py``. SGLang's ``linear.py`` adds quantization methods, fused-shard-on-disk formats, bias
skipping and custom weight-loading v2 paths.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from minisgl.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from minisgl.layers.amx_utils import (
    apply_linear,
    keep_blocked_copy,
    keep_float32_copy,
    keep_gemm_copy,
    min_packed_rows,
    prepack_weight,
)
from minisgl.utils.common import InputError


def _new_param(*shape: int, weight_loader) -> nn.Parameter:
    param = nn.Parameter(torch.empty(*shape), requires_grad=False)
    param.weight_loader = weight_loader
    return param


def copy_checked(param: torch.Tensor, loaded: torch.Tensor) -> None:
    if param.shape != loaded.shape:
        raise InputError(
            f"checkpoint tensor of shape {tuple(loaded.shape)} does not fit parameter of shape "
            f"{tuple(param.shape)}; the weights do not match the model config"
        )
    param.data.copy_(loaded)


def shard(loaded: torch.Tensor, dim: int, index: int, size: int, full_size: int) -> torch.Tensor:
    """Slice ``index`` of width ``size`` along ``dim``, after checking the checkpoint has the full width."""
    if loaded.shape[dim] != full_size:
        raise InputError(
            f"checkpoint tensor of shape {tuple(loaded.shape)} has {loaded.shape[dim]} rows/columns where the "
            f"model config implies {full_size}; the weights do not match the model config"
        )
    return loaded.narrow(dim, index * size, size)


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    copy_checked(param, loaded_weight)


def prepack_linear_weights(model: nn.Module) -> None:
    """Swap every linear layer's weight for its prepacked form, after loading (loaders need the plain one)."""
    for module in model.modules():
        if isinstance(module, (ReplicatedLinear, RowParallelLinear)):
            packed = nn.Parameter(prepack_weight(module.weight), requires_grad=False)
            if packed.is_mkldnn:
                min_packed_rows()  # probed at load, not in the first forward, which a benchmark may time
            keep_blocked_copy(packed, module.weight)
            keep_gemm_copy(packed, module.weight)
            keep_float32_copy(packed)
            module.weight = packed


def keep_blocked_copies(model: nn.Module) -> None:
    """A compiled model's counterpart of ``prepack_linear_weights``: its weights stay plain (Inductor's freezing
    packs them for each graph), and each linear weight and the LM head gets only the column-blocked copy
    (``keep_blocked_copy``), which the graphs of up to ``BLOCKED_MAX_ROWS`` rows pass to the C++ kernel."""
    for module in model.modules():
        if isinstance(module, (ReplicatedLinear, RowParallelLinear)):
            keep_blocked_copy(module.weight, module.weight)
    keep_blocked_copy(model.lm_head.weight, model.lm_head.weight)


class ReplicatedLinear(nn.Module):
    """The same full weight on every rank."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__()
        self.weight = _new_param(output_size, input_size, weight_loader=default_weight_loader)
        self.bias = _new_param(output_size, weight_loader=default_weight_loader) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return apply_linear(x, self.weight, self.bias)


class ColumnParallelLinear(ReplicatedLinear):
    """Output features split across ranks: rank r holds rows ``[r*n/tp, (r+1)*n/tp)`` of the weight."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        super().__init__(input_size, output_size // self.tp_size, bias)
        self.weight.weight_loader = self.weight_loader
        if self.bias is not None:
            self.bias.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        size = param.shape[0]
        copy_checked(param, shard(loaded_weight, 0, self.tp_rank, size, size * self.tp_size))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs fused in one matmul (gate and up): one GEMM instead of two."""

    def __init__(self, input_size: int, output_sizes: Sequence[int], bias: bool = False):
        self.output_sizes = list(output_sizes)
        super().__init__(input_size, sum(output_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, loaded_shard_id: int = 0) -> None:
        size = self.output_sizes[loaded_shard_id] // self.tp_size
        offset = sum(self.output_sizes[:loaded_shard_id]) // self.tp_size
        full = self.output_sizes[loaded_shard_id]
        copy_checked(param.data.narrow(0, offset, size), shard(loaded_weight, 0, self.tp_rank, size, full))


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections fused and split by heads; KV heads are replicated when tp > their number."""

    def __init__(
        self, hidden_size: int, head_size: int, total_num_heads: int, total_num_kv_heads: int, bias: bool = False
    ):
        tp_size = get_tensor_model_parallel_world_size()
        self.head_size = head_size
        self.num_heads = total_num_heads // tp_size
        self.num_kv_heads = max(1, total_num_kv_heads // tp_size)
        self.num_kv_head_replicas = max(1, tp_size // total_num_kv_heads)
        self.total_num_kv_heads = total_num_kv_heads
        output_size = (self.num_heads + 2 * self.num_kv_heads) * head_size * tp_size
        super().__init__(hidden_size, output_size, bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, loaded_shard_id: str = "q") -> None:
        q_size, kv_size = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        if loaded_shard_id == "q":
            offset, size, shard_rank, full = 0, q_size, self.tp_rank, q_size * self.tp_size
        else:
            offset = q_size if loaded_shard_id == "k" else q_size + kv_size
            size, shard_rank = kv_size, self.tp_rank // self.num_kv_head_replicas
            full = self.total_num_kv_heads * self.head_size
        copy_checked(param.data.narrow(0, offset, size), shard(loaded_weight, 0, shard_rank, size, full))


class RowParallelLinear(nn.Module):
    """Input features split across ranks; partial outputs are summed by an all-reduce, then the bias added."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.weight = _new_param(output_size, input_size // self.tp_size, weight_loader=self.weight_loader)
        self.bias: nn.Parameter | None = _new_param(output_size, weight_loader=default_weight_loader) if bias else None

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        size = param.shape[1]
        copy_checked(param, shard(loaded_weight, 1, self.tp_rank, size, size * self.tp_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = tensor_model_parallel_all_reduce(apply_linear(x, self.weight))
        return out if self.bias is None else out + self.bias
