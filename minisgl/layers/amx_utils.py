"""CPU linear kernels: which one multiplies each weight, chosen at load by probes, and the weight forms each reads.

``apply_linear`` is every linear layer's product. On a CPU the plain ``[out, in]`` weight is rarely the fastest
form: oneDNN's prepacked layout streams a decode's few rows faster, and where probes time it so, minisgl's C++
kernel reads a column-blocked copy faster still for them, and MKL the plain weight faster for a long prefill's
rows; on a CPU without bfloat16 arithmetic, batched bfloat16 rows multiply a float32 copy. The probes run once per
process, at load, on weights past the caches; each switches kernels only for one at least 10% faster.

Named after its counterpart, SGLang's ``amx_utils.py``, whose ``_amx_process_weight_after_loading`` packs CPU
weights for sgl_kernel's AMX GEMMs wherever ``cpu_has_amx_support()``, with no probe and no second copy; its
``UnquantizedLinearMethod.apply`` (``quantization/unquant.py``) then calls them or ``F.linear``.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from minisgl.layers.cpu_kernels import cpu_kernels_built


def _probe_weights(dtype: torch.dtype = torch.float32) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """128 MiB of float32 ``[out, in]`` weights (64 of bfloat16), plain and as ``prepack_weight`` leaves them:
    past the caches, as a model's weights are."""
    plain = [torch.full((2048, 2048), 0.01, dtype=dtype) for _ in range(8)]
    return plain, [prepack_weight(w) for w in plain]


def alternating_seconds(
    passes: Sequence[Callable[[], object]],
    reps: int = 7,
    statistic: Callable[[list[float]], float] = statistics.median,
    before_each: Callable[[], object] | None = None,
) -> list[float]:
    """Seconds of each pass (the median of its times, or another ``statistic``), over ``reps`` rounds that run
    every pass in turn, after one warm-up round (fresh pages), each pass after ``before_each`` where given (untimed:
    a benchmark's cache flush). Alternating matters on a shared VM: its slow phases last longer than a pass, and
    timed one kernel after the other they fall on whichever ran then (here one kernel read at 16-19 GB/s in one run
    of seven passes and at 22-31 in the next)."""
    times: list[list[float]] = [[] for _ in passes]
    for rep in range(reps + 1):
        for fn, kept in zip(passes, times):
            if before_each is not None:
                before_each()
            tic = time.perf_counter()
            fn()
            if rep:
                kept.append(time.perf_counter() - tic)
    return [statistic(kept) for kept in times]


def _is_faster_by_a_tenth(
    alternative: Callable[[], object],
    default: Callable[[], object],
    reps: int = 7,
    statistic: Callable[[list[float]], float] = statistics.median,
) -> bool:
    """The probes' rule: switch from the default kernel only for one that takes under 90% of its time."""
    alternative_seconds, default_seconds = alternating_seconds([alternative, default], reps, statistic)
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
    """``x @ weight.T + bias`` with the kernel chosen at load for this weight: minisgl's C++ one over a
    column-blocked copy for a decode's few rows (``keep_blocked_copy``), oneDNN's packed one (padded where
    ``min_packed_rows`` says), MKL's over the plain float32 weight for a long prefill's rows (``keep_gemm_copy``;
    traced, ``plain_weight_linear``), float32 copies for batched bfloat16 rows on CPUs without bfloat16
    arithmetic, else ``F.linear``."""
    rows = x.shape[0]
    blocked_weight = getattr(weight, "blocked_weight", None)
    if blocked_weight is not None and rows <= BLOCKED_MAX_ROWS and x.dim() == 2:  # see keep_blocked_copy
        return blocked_linear(x, blocked_weight, bias, weight.shape[0])
    if not weight.is_mkldnn:
        if multiplies_in_float32(weight) and rows > 1:
            return linear_in_float32(x, weight, bias)
        if traced_gemm_on_plain_weight(x, weight):
            return plain_weight_linear(x, weight, bias)
        return F.linear(x, weight, bias)
    gemm_weight = getattr(weight, "gemm_weight", None)
    if rows >= MKL_GEMM_MIN_ROWS and gemm_weight is not None:  # see keep_gemm_copy
        return F.linear(x, gemm_weight, bias)
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
    see ``keep_blocked_copy``). Sums are reordered, so results move by float rounding only.
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


# Rows up to which a linear runs the C++ kernel over its column-blocked copy, where kept (``keep_blocked_copy``).
# AMD EPYC Zen 3 (AVX2), a SmolLM2 step's linears and LM head, float32 ms against oneDNN's packed kernel (alternated,
# median of 5): 1 row 16.3 vs 22.7, 2 19.5 vs 24.4, 4 22.1 vs 28.8, 8 25.1 vs 34.4, 12 32.6 vs 42.7, 16 57.0 vs 61.0
# (39.4 vs 52.0 in another run), 32 83.8 vs 81.5: even from 32 rows on, so oneDNN keeps those.
BLOCKED_MAX_ROWS = 16
BLOCKED_DTYPES = (torch.float32, torch.bfloat16)


def block_weight(weight: torch.Tensor) -> torch.Tensor:
    """A float32/bfloat16 ``[out, in]`` weight as the C++ kernel reads it: ``[blocks, in, width]``, each block the
    weights of ``width`` output features (two vectors of the build's ISA: 16 on AVX2), stored k by k; the last
    block zero-padded. A bfloat16 weight of an even ``in`` on a CPU with AVX512-BF16 is stored pair of ks by pair,
    ``[blocks, in / 2, width, 2]``, for the dot-product instruction that reads a pair at once (``set_bfloat16_pairs(False)`` keeps the first layout, to compare). The kernels must be built
    (``cpu_kernels_built``)."""
    return torch.ops.minisgl_cpu.block_weight(weight)


def blocked_linear(
    x: torch.Tensor, blocked: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    """``x @ W^T + bias`` of a few float32/bfloat16 rows over ``W``'s column-blocked copy, by the C++ kernel
    (``csrc/gemm.cpp``): each thread streams its blocks of output features front to back, their rows' sums held in
    registers. The output has ``x``'s dtype; bfloat16 products are summed in float32 and rounded once."""
    return torch.ops.minisgl_cpu.blocked_linear(x, blocked, bias, out_features)


# How far ahead the C++ kernel may prefetch a single row's weights, in bytes; the kernel's default (16 KiB) first.
SINGLE_ROW_PREFETCH_CHOICES = (16 * 1024, 4 * 1024, 0)


@functools.cache
def single_row_prefetch_bytes() -> int:
    """How far ahead of its reads the C++ kernel prefetches a single row's weights: of
    ``SINGLE_ROW_PREFETCH_CHOICES``, the one that streams the probe's 128 MiB of float32 weights fastest, alternated
    (the first on a tie). Probed once per process and set in the kernel, for every dtype; 0 where the kernels
    are not built. A batch-1 decode step is single-row linears: which distance suits them is the CPU's
    (``csrc/gemm.cpp`` has the figures: 16 KiB on a Xeon, 4 KiB or none on an AMD EPYC Zen 4)."""
    if not cpu_kernels_built():
        return 0
    plain, _ = _probe_weights()
    blocked = [(block_weight(w), w.shape[0]) for w in plain]
    x = torch.ones(1, plain[0].shape[1])

    def stream(ahead: int) -> Callable[[], object]:
        def run() -> None:
            torch.ops.minisgl_cpu.set_single_row_prefetch(ahead)
            for weight, out_features in blocked:
                blocked_linear(x, weight, None, out_features)

        return run

    seconds = alternating_seconds([stream(ahead) for ahead in SINGLE_ROW_PREFETCH_CHOICES])
    chosen = SINGLE_ROW_PREFETCH_CHOICES[seconds.index(min(seconds))]
    torch.ops.minisgl_cpu.set_single_row_prefetch(chosen)
    return chosen


@functools.cache
def blocked_linear_is_faster(dtype: torch.dtype) -> bool:
    """Whether the C++ kernel over column-blocked copies multiplies 1 and 8 rows of ``dtype`` at least 10% faster,
    both counted together, than the kernels ``apply_linear`` picks for the plain weight otherwise (oneDNN's packed
    one; for bfloat16 where oneDNN has none, ``F.linear`` for 1 row and float32 copies for 8). False where the
    kernels are not built.

    Probed once per process and dtype, on 128 MiB of float32 weights (64 MiB of bfloat16): which kernel streams a
    weight fastest differs from one CPU to another. AMD EPYC Zen 3 (AVX2), a SmolLM2 step's linears and head, ms
    (alternated, median of 5): float32 as in ``BLOCKED_MAX_ROWS``; bfloat16 1 row 12.0 against ``F.linear`` 16.6,
    8 rows 24.8 against the float32 copies' ~35. The kernel is plain FMAs over
    ATen's ``Vectorized`` for the ISA Inductor picks (AVX2 or AVX-512), and AVX512-BF16's dot products for bfloat16
    where the CPU has them, with no AMX tiles, so where oneDNN has those it may lose. AMD EPYC Zen 4 (AVX512-BF16),
    bfloat16: widened, the kernel was under 10% faster than oneDNN (no copies kept); in pairs, 1 and 8 rows
    together ~1.5x (the figures are in ``csrc/gemm.cpp``).
    """
    if not cpu_kernels_built():
        return False
    single_row_prefetch_bytes()  # the kernel is timed at its distance
    plain, current = _probe_weights(dtype)
    for weight in current:
        keep_float32_copy(weight)
    blocked = [block_weight(w) for w in plain]
    xs = [torch.ones(rows, 2048, dtype=dtype) for rows in (1, 8)]
    return _is_faster_by_a_tenth(
        lambda: [blocked_linear(x, b, None, 2048) for x in xs for b in blocked],
        lambda: [apply_linear(x, w) for x in xs for w in current],
    )


def blocked_copies() -> dict[str, bool]:
    """Each dtype's answer of ``blocked_linear_is_faster`` (probing it where not yet probed), by dtype name: what
    a benchmark records of this process's choice."""
    return {str(dtype).removeprefix("torch."): blocked_linear_is_faster(dtype) for dtype in BLOCKED_DTYPES}


def keep_blocked_copy(weight_form: torch.Tensor, weight: torch.Tensor) -> None:
    """Give a CPU linear weight (``weight_form``: oneDNN's packed one, or the plain one where oneDNN does not pack
    its dtype) a column-blocked copy of ``weight`` for inputs of up to ``BLOCKED_MAX_ROWS`` rows, where
    ``blocked_linear_is_faster``.

    A decode step is a weight read per linear, so its linears' time is the kernel's read rate. The price is one
    more copy of every linear weight in its dtype (SmolLM2 float32: +538 MB), beside the packed one and any plain
    float32 (``keep_gemm_copy``) or float32 copy (``keep_float32_copy``) kept for longer inputs."""
    if weight.device.type == "cpu" and weight.dtype in BLOCKED_DTYPES:
        if cpu_kernels_built() and blocked_linear_is_faster(weight.dtype):  # built first, even with the probe forced
            weight_form.blocked_weight = block_weight(weight.detach())


# Rows from which a float32 linear runs MKL's GEMM on its plain weight, where that is kept (``keep_gemm_copy``):
# below them oneDNN's packed kernel stays the faster even there (AMD EPYC Zen 3, AVX2, dummy134 float32 eager
# prefill with the plain weights from 256 rows: 1x256 327 -> 357 ms; from 512, bench/prefill_levers.py: 1x512
# 676 -> 653, 8x128 1214 -> 1102).
MKL_GEMM_MIN_ROWS = 512


_mkl_gemm_is_faster: bool | None = None


def mkl_gemm_is_faster() -> bool:
    """Whether MKL's GEMM on a plain float32 weight multiplies 1,024 rows at least 10% faster than oneDNN's packed
    kernel on this CPU (``apply_linear``'s kernel for them). Probed once per process, on one 2048-square weight
    (~1 s): on an AMD EPYC Zen 3 (AVX2, no AVX-512) MKL takes 85-88% of oneDNN's time there (at 512 rows 90%,
    at 2,048 85%; at 256 oneDNN is the faster, 148 against 156 GFLOP/s over dummy134's four linears). Other CPUs
    were not measured this way: the probe decides there. Memoized in a plain global, which traced code reads
    (``traced_gemm_on_plain_weight``)."""
    global _mkl_gemm_is_faster
    if _mkl_gemm_is_faster is None:
        _mkl_gemm_is_faster = _mkl_gemm_probe()
    return _mkl_gemm_is_faster


def _mkl_gemm_probe() -> bool:
    weight = torch.full((2048, 2048), 0.01)
    packed = prepack_weight(weight)
    if not packed.is_mkldnn:
        return False
    x = torch.ones(1024, 2048)
    # Each kernel's fastest of nine passes: a compute-bound GEMM is only ever slowed by what else runs, and MKL's
    # ~14% lead sits near the 10% margin. On an AMD EPYC Zen 3, with medians of three a benchmark's engines chose
    # oneDNN for dummy134 and MKL for SmolLM2 in one run, and alone the probe chose oneDNN 2 times in 6 (ratios
    # 0.85-1.08); the fastest of nine gave 0.83-0.86 in 8 of 8 (~1.1 s).
    return _is_faster_by_a_tenth(lambda: F.linear(x, weight), lambda: apply_linear(x, packed), reps=9, statistic=min)


def traced_gemm_on_plain_weight(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a compiled graph multiplies ``x`` by this plain float32 CPU weight in MKL's GEMM
    (``plain_weight_linear``) rather than leave ``F.linear`` to Inductor, whose freezing packs every linear's weight
    for oneDNN: for ``MKL_GEMM_MIN_ROWS`` rows or more where ``mkl_gemm_is_faster``, as eager ``apply_linear``
    reads its ``keep_gemm_copy``. It reads the probe's result without probing (``CPUGraphRunner`` probes at load):
    the probe traced would break the graph into pieces. The result goes first, so that where it is false the row
    count adds no guard (and no graph) at all, and an eager product (a CUDA one, never probed) pays one read."""
    return (
        bool(_mkl_gemm_is_faster)
        and torch.compiler.is_compiling()
        and weight.dtype == torch.float32
        and weight.device.type == "cpu"
        and x.shape[0] >= MKL_GEMM_MIN_ROWS
    )


@torch.library.custom_op("minisgl::plain_weight_linear", mutates_args=())
def plain_weight_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` on a plain ``[out, in]`` weight as an opaque op, which Inductor calls as it is: its freezing
    passes cannot swap it for oneDNN's packed kernel, so a compiled long prefill runs MKL's GEMM, as an eager one
    does. SGLang's CPU path makes no such choice: with AMX its ``sgl_kernel`` GEMMs read weights packed at load,
    without it ``F.linear`` is left to Inductor."""
    return F.linear(x, weight, bias)


@plain_weight_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def keep_gemm_copy(packed: torch.Tensor, weight: torch.Tensor) -> None:
    """Keep a prepacked float32 weight's plain form beside it, for inputs of ``MKL_GEMM_MIN_ROWS`` rows or more,
    where ``mkl_gemm_is_faster``: there a long prefill's products run at MKL's rate (AMD EPYC Zen 3, the four
    linears of a dummy134 layer at 1,024 rows: 178 against 156 GFLOP/s; the eager prefills are in
    ``MKL_GEMM_MIN_ROWS``). Decode batches keep the packed kernel (or the C++ one), which streams their few rows'
    weights faster.
    The price is a second copy of every float32 linear weight (dummy134: +340 MB), the one a user's plain model
    holds; the LM head, which a prefill runs on each request's last token alone, gets none. Bfloat16 weights get
    none either: their copies for batched rows (``keep_float32_copy``) already double them."""
    if packed.is_mkldnn and weight.dtype == torch.float32 and mkl_gemm_is_faster():
        packed.gemm_weight = weight.detach()


def keep_float32_copy(weight: torch.Tensor) -> None:
    """Give a bfloat16 weight on a CPU without bfloat16 arithmetic (``CPU_MULTIPLIES_BFLOAT16``) a prepacked
    float32 copy, which ``apply_linear`` reads for inputs of two or more rows (past ``BLOCKED_MAX_ROWS`` where the
    C++ kernel's blocked copy is kept: it reads the bfloat16 weight itself, faster still).

    Where oneDNN has no bfloat16 kernels (an AVX2-only CPU) torch multiplies bfloat16 matrices in a generic
    kernel at a fifth of float32's rate, compute-bound from two rows on: on a 2-core AMD EPYC (Zen 3, AVX2)
    dummy134's linears run at 18-19 GFLOP/s at every row count (8 rows: 75 ms a step; 128: 1.14 s), float32
    ones at 84-114. The copy is exact (every bfloat16 value is a float32 one), its products and sums are
    float32 as a bfloat16 GEMM's are, and the output is rounded to bfloat16 once, so results move by summation
    order only. Without a blocked copy a single row keeps the bfloat16 weight, whose GEMV streams half the bytes: in
    bfloat16 bytes per second (``bench/decode_kernels.py``), dummy134's linears and head read at 15.1 GB/s
    through ``F.linear`` against 9.1 through the copy, SmolLM2's 14.2 against 8.2; at 2 rows they tie (8.7 /
    8.8), at 8 the copy leads (5.7 against 2.2). The price is 4 bytes per parameter (SmolLM2: +540 MB on its
    270), and batched rows read twice the bytes the model's dtype implies.
    """
    if multiplies_in_float32(weight):
        weight.float32_weight = prepack_weight(weight.detach().float())
