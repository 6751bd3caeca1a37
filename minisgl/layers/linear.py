"""Tensor-parallel linear layers with SGLang's names, and their weight loaders.

A column-parallel layer splits its *output* features across ranks (each rank computes a slice, no
communication); a row-parallel layer splits its *input* features and all-reduces the partial sums.
Pairing them (qkv/gate_up column-parallel, o/down row-parallel) costs one all-reduce per block.

Each parameter carries a ``weight_loader`` that takes the *full* checkpoint tensor and copies in only
this rank's shard, so ``load_weights`` is the same loop at any tp size. SGLang's ``linear.py`` adds
quantization methods, fused-shard-on-disk formats, bias skipping and custom weight-loading v2 paths.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
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


def _probe_weights() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """128 MiB of float32 ``[out, in]`` weights, plain and prepacked: past the caches, as a model's weights are."""
    plain = [torch.full((2048, 2048), 0.01) for _ in range(8)]
    return plain, [prepack_weight(w) for w in plain]


def alternating_median_seconds(passes: Sequence[Callable[[], object]], reps: int = 7) -> list[float]:
    """Median seconds of each pass, over ``reps`` rounds that run every pass in turn, after one warm-up round
    (fresh pages). Alternating matters on a shared VM: its slow phases last longer than a pass, and timed one
    kernel after the other they fall on whichever ran then (here one kernel read at 16-19 GB/s in one run of
    seven passes and at 22-31 in the next)."""
    times: list[list[float]] = [[] for _ in passes]
    for rep in range(reps + 1):
        for fn, kept in zip(passes, times):
            tic = time.perf_counter()
            fn()
            if rep:
                kept.append(time.perf_counter() - tic)
    return [statistics.median(kept) for kept in times]


def _is_faster_by_a_tenth(alternative: Callable[[], object], default: Callable[[], object], reps: int = 7) -> bool:
    """The probes' rule: switch from the default kernel only for one that takes under 90% of its time."""
    alternative_seconds, default_seconds = alternating_median_seconds([alternative, default], reps)
    return alternative_seconds < 0.9 * default_seconds


def _packed_rows_probe() -> int:
    """How many rows oneDNN's packed kernels run for 1-3 input rows: 4 (the rest padded with zeros) where its
    4-row kernel streams a weight at least 10% faster than its 1-row one, else 1 (nothing padded).

    Which is faster depends on the CPU and even on the VM: on a Xeon VM with AMX one session measured the 4-row
    kernel ~15% faster (SmolLM2's linears, float32 and bfloat16; compiled batch-1 decode 33.6 -> 24.2 ms/step
    padded), a later one the 1-row kernel ~8% faster (every SmolLM2 float32 linear once: 26.9 against 29.2 ms;
    compiled batch-1 decode 33.6 padded -> 24.9 ms/step unpadded); on an AMD EPYC (AVX-512, no AMX) 1 row
    was faster (58-60 against 52-54 GB/s). Probed only on CPUs with AMX: elsewhere no CPU measured so far
    favoured padding.
    """
    if not torch.cpu._is_amx_tile_supported() or not torch.backends.mkldnn.is_available():
        return 1
    _, packed = _probe_weights()
    one, four = torch.ones(1, 2048), torch.ones(4, 2048)

    def rows(x: torch.Tensor) -> Callable[[], object]:
        return lambda: [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for w in packed]

    return 4 if _is_faster_by_a_tenth(rows(four), rows(one)) else 1


# Whether oneDNN multiplies bfloat16 on this CPU (AVX512-BF16, AVX-512 BW/VL/DQ, AVX-NE-CONVERT or AMX). False on an
# AVX2-only x86 CPU (and wherever torch is built without oneDNN): there torch's bfloat16 matmul is a generic kernel,
# and batched rows multiply float32 copies instead (``keep_float32_copy``).
CPU_MULTIPLIES_BFLOAT16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def multiplies_in_float32(weight: torch.Tensor) -> bool:
    """Whether batched rows multiply ``weight`` in float32 (``keep_float32_copy``): a plain bfloat16 CPU weight
    on a CPU where oneDNN has no bfloat16 kernels."""
    return (
        weight.dtype == torch.bfloat16
        and weight.device.type == "cpu"
        and not weight.is_mkldnn
        and not CPU_MULTIPLIES_BFLOAT16
    )


def linear_in_float32(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` of bfloat16 tensors, multiplied in float32 and rounded to bfloat16 once.

    Eagerly it reads the copy ``keep_float32_copy`` made at load. Traced, it converts the weight in the graph:
    Inductor's freezing folds that conversion into a packed float32 constant, once per compiled graph (a copy
    made eagerly, a oneDNN tensor, cannot go into a traced ``F.linear``)."""
    float32_weight = None if torch.compiler.is_compiling() else getattr(weight, "float32_weight", None)
    float32_weight = weight.float() if float32_weight is None else float32_weight
    float32_bias = None if bias is None else bias.float()
    return apply_linear(x.float(), float32_weight, float32_bias).to(x.dtype)


def apply_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` with the kernel chosen at load for this weight: oneDNN's packed one (padded where
    ``min_packed_rows`` says), MKL's over a column-blocked copy for one float32 row (``keep_gemv_copy``), MKL's
    over the plain float32 weight for a long prefill's rows (``keep_gemm_copy``), float32 copies for batched
    bfloat16 rows on CPUs without bfloat16 arithmetic, else ``F.linear``."""
    if not weight.is_mkldnn:
        if multiplies_in_float32(weight) and x.shape[0] > 1:
            return linear_in_float32(x, weight, bias)
        return F.linear(x, weight, bias)
    rows = x.shape[0]
    gemm_weight = getattr(weight, "gemm_weight", None)
    if rows >= MKL_GEMM_MIN_ROWS and gemm_weight is not None:  # see keep_gemm_copy
        return F.linear(x, gemm_weight, bias)
    gemv_weight = getattr(weight, "gemv_weight", None)
    if rows == 1 and gemv_weight is not None:  # see keep_gemv_copy
        out = blocked_gemv(x, gemv_weight, weight.shape[0])
        return out if bias is None else out.add_(bias)
    packed_rows = min_packed_rows()
    if rows >= packed_rows:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    # The weight read is the whole cost of these few rows: zero rows are padded on and their outputs dropped.
    padded = F.pad(x, (0, 0, 0, packed_rows - rows))
    return torch.ops.mkldnn._linear_pointwise(padded, weight, bias, "none", [], "")[:rows]


def prepack_weight(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's blocked layout of a ``[out, in]`` weight (CPU, float32/bfloat16), or the weight unchanged.

    MKL's GEMM reads the plain layout at about half of the memory bandwidth for the skinny matmuls of batched
    decode (2-32 rows); oneDNN's prepacked kernels read it faster (a single float32 row may be faster on MKL:
    see ``keep_gemv_copy``). Sums are reordered, so results move by float rounding only.
    """
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return weight
    if weight.dtype != torch.float32 and not (weight.dtype == torch.bfloat16 and CPU_MULTIPLIES_BFLOAT16):
        return weight
    # Packed for 8-row inputs: measured best for both 1-row and batched decode, and prefill is unaffected.
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 8)


_min_packed_rows: int | None = None


def min_packed_rows() -> int:
    """The fewest rows oneDNN's packed kernels are given (``_packed_rows_probe``), probed on first use.

    Not at import: the probe allocates 256 MiB and reads it for ~0.2 s, which a CUDA run, the reader or a test
    that never packs a weight should not pay. A CPU model's load calls it (``prepack_linear_weights``, and
    ``CPUGraphRunner`` for compiled models, whose weights Inductor packs), so no timed forward includes the probe.
    A plain global rather than ``functools.cache``: ``apply_linear`` may be traced, and Dynamo traces through
    ``functools.cache`` into the probe itself (compiled models keep plain weights, so today traced code returns
    before it reads this).
    """
    global _min_packed_rows
    if _min_packed_rows is None:
        _min_packed_rows = _packed_rows_probe()
    return _min_packed_rows


# Output features per block of a GEMV copy. Measured on an AMD EPYC VM, float32 one row, median GB/s on
# SmolLM2's / dummy134's shapes: 16 columns 18.8 / 20.9, 32 columns 19.1 / 22.2, 64 columns 11.5 / 13.8.
GEMV_BLOCK_COLUMNS = 32


def column_blocked(weight: torch.Tensor) -> torch.Tensor:
    """A float32 ``[out, in]`` weight as ``[out / 32, in, 32]`` blocks, each block's columns the weights of 32
    output features (the last block zero-padded): the layout ``blocked_gemv`` reads."""
    pad = -weight.shape[0] % GEMV_BLOCK_COLUMNS
    padded = F.pad(weight.detach(), (0, 0, 0, pad))
    return padded.view(-1, GEMV_BLOCK_COLUMNS, weight.shape[1]).transpose(1, 2).contiguous()


def blocked_gemv(x: torch.Tensor, blocked: torch.Tensor, out_features: int) -> torch.Tensor:
    """``x @ W^T`` over ``column_blocked(W)``: one batched product (``bmm``, MKL's ``SGEMM_BATCH``), ``x @ [in,
    32]`` per block; each block is contiguous, so each small GEMM reads its weights front to back.

    Made for single rows (``apply_linear``), whose result is already in feature order: a view, sliced only
    where the last block is padded (each extra view op costs ~1 us, and a SmolLM2 step runs 121 linears). More
    rows are gathered from the blocks, for ``bench/decode_kernels.py``.
    """
    out = torch.matmul(x, blocked)  # [blocks, rows, 32]
    out = out.view(1, -1) if x.shape[0] == 1 else out.transpose(0, 1).reshape(x.shape[0], -1)
    return out if out.shape[1] == out_features else out[:, :out_features]


@functools.cache
def mkl_gemv_is_faster() -> bool:
    """Whether MKL's batched GEMM over column-blocked float32 weights (``blocked_gemv``) reads a single row's
    weights at least 10% faster than oneDNN's packed kernel does on this CPU (as ``apply_linear`` calls it,
    padded where it pads).

    Probed once per process, on 128 MiB of weights (past the caches, as a model's are): which kernel streams
    fastest differs from one CPU, and one VM, to another. On an AMD EPYC VM (Zen 4, no AMX), float32 linears
    and LM head at one row, median GB/s over four runs: SmolLM2's blocked 16.3-19.4, oneDNN packed 15.1-18.0;
    dummy134's 17.7-25.8 against 16.2-19.3; MKL's GEMV over a K-major copy 13.3 and 14.8 (the copies' layout
    before the blocked one; on a Xeon VM with AMX it had led, 27-28 against oneDNN's 20-21, where the blocked
    layout was not measured). At two or more rows oneDNN is faster (at eight, 15 GB/s against 10-11), so
    batches keep the packed weight. In bfloat16 oneDNN is the faster one at every row count (15-18 GB/s against
    6-15 blocked), so only float32 is probed.
    """
    weights, packed = _probe_weights()
    if not packed[0].is_mkldnn:
        return False
    blocked = [column_blocked(w) for w in weights]
    x = torch.ones(1, 2048)
    return _is_faster_by_a_tenth(
        lambda: [blocked_gemv(x, w, 2048) for w in blocked], lambda: [apply_linear(x, w) for w in packed]
    )


def keep_gemv_copy(packed: torch.Tensor, weight: torch.Tensor) -> None:
    """Give a prepacked float32 weight a column-blocked copy for single-row inputs, where MKL reads that faster.

    A batch-1 decode step is one weight read per linear, so its time is the kernel's read rate. Float32 batch-1
    eager decode, in-process A/B on an AMD EPYC VM, ms/step (median of five runs): SmolLM2 55.3 -> 48.0 and
    55.6 -> 47.9, dummy134 32.9 -> 28.3; on a Xeon VM with AMX, with the K-major copies of then, SmolLM2 48.8 ->
    34.8. The price is a second copy of every float32 linear weight (SmolLM2: +538 MB), kept only where
    ``mkl_gemv_is_faster``.
    """
    if packed.is_mkldnn and weight.dtype == torch.float32 and mkl_gemv_is_faster():
        packed.gemv_weight = column_blocked(weight)


# Rows from which a float32 linear runs MKL's GEMM on its plain weight, where that is kept (``keep_gemm_copy``):
# below them oneDNN's packed kernel stays the faster even there (AMD EPYC Zen 3, AVX2, dummy134 float32 eager
# prefill with the plain weights from 256 rows: 1x256 327 -> 357 ms; from 512, bench/prefill_levers.py: 1x512
# 676 -> 653, 8x128 1214 -> 1102).
MKL_GEMM_MIN_ROWS = 512


@functools.cache
def mkl_gemm_is_faster() -> bool:
    """Whether MKL's GEMM on a plain float32 weight multiplies 1,024 rows at least 10% faster than oneDNN's packed
    kernel on this CPU (``apply_linear``'s kernel for them). Probed once per process, on one 2048-square weight
    (~0.4 s): on an AMD EPYC Zen 3 (AVX2, no AVX-512) MKL takes 85-88% of oneDNN's time there (at 512 rows 90%,
    at 2,048 85%; at 256 oneDNN is the faster, 148 against 156 GFLOP/s over dummy134's four linears). Other CPUs
    were not measured this way: the probe decides there."""
    weight = torch.full((2048, 2048), 0.01)
    packed = prepack_weight(weight)
    if not packed.is_mkldnn:
        return False
    x = torch.ones(1024, 2048)
    return _is_faster_by_a_tenth(lambda: F.linear(x, weight), lambda: apply_linear(x, packed), reps=3)


def keep_gemm_copy(packed: torch.Tensor, weight: torch.Tensor) -> None:
    """Keep a prepacked float32 weight's plain form beside it, for inputs of ``MKL_GEMM_MIN_ROWS`` rows or more,
    where ``mkl_gemm_is_faster``: there a long prefill's products run at MKL's rate (AMD EPYC Zen 3, the four
    linears of a dummy134 layer at 1,024 rows: 178 against 156 GFLOP/s; the eager prefills are in
    ``MKL_GEMM_MIN_ROWS``). Decode batches keep the packed kernel, which streams their few rows' weights faster.
    The price is a second copy of every float32 linear weight (dummy134: +340 MB), the one a user's plain model
    holds; the LM head, which a prefill runs on each request's last token alone, gets none. Bfloat16 weights get
    none either: their copies for batched rows (``keep_float32_copy``) already double them."""
    if packed.is_mkldnn and weight.dtype == torch.float32 and mkl_gemm_is_faster():
        packed.gemm_weight = weight.detach()


def keep_float32_copy(weight: torch.Tensor) -> None:
    """Give a bfloat16 weight on a CPU without bfloat16 arithmetic (``CPU_MULTIPLIES_BFLOAT16``) a prepacked
    float32 copy, which ``apply_linear`` reads for inputs of two or more rows.

    Where oneDNN has no bfloat16 kernels (an AVX2-only CPU) torch multiplies bfloat16 matrices in a generic
    kernel at a fifth of float32's rate, compute-bound from two rows on: on a 2-core AMD EPYC (Zen 3, AVX2)
    dummy134's linears run at 18-19 GFLOP/s at every row count (8 rows: 75 ms a step; 128: 1.14 s), float32
    ones at 84-114. The copy is exact (every bfloat16 value is a float32 one), its products and sums are
    float32 as a bfloat16 GEMM's are, and the output is rounded to bfloat16 once, so results move by summation
    order only. A single row keeps the bfloat16 weight, whose GEMV streams half the bytes: there, in
    bfloat16 bytes per second (``bench/decode_kernels.py``), dummy134's linears and head read at 15.1 GB/s
    through ``F.linear`` against 9.1 through the copy, SmolLM2's 14.2 against 8.2; at 2 rows they tie (8.7 /
    8.8), at 8 the copy leads (5.7 against 2.2). The price is 4 bytes per parameter (SmolLM2: +540 MB on its
    270), and batched rows read twice the bytes the model's dtype implies.
    """
    if multiplies_in_float32(weight):
        weight.float32_weight = prepack_weight(weight.detach().float())


def prepack_linear_weights(model: nn.Module) -> None:
    """Swap every linear layer's weight for its prepacked form, after loading (loaders need the plain one)."""
    for module in model.modules():
        if isinstance(module, (ReplicatedLinear, RowParallelLinear)):
            packed = nn.Parameter(prepack_weight(module.weight), requires_grad=False)
            if packed.is_mkldnn:
                min_packed_rows()  # probed at load, not in the first forward, which a benchmark may time
            keep_gemv_copy(packed, module.weight)
            keep_gemm_copy(packed, module.weight)
            keep_float32_copy(packed)
            module.weight = packed


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
