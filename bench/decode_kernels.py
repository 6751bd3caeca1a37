"""The CPU decode kernels the start-up probes choose between, side by side on a model's own linear weights.

    python bench/decode_kernels.py                           # SmolLM2, float32 and bfloat16, 1, 4, 8 rows (~1 min)
    python bench/decode_kernels.py --models dummy134 --rows 1 2 --reps 9
    python bench/decode_kernels.py --levers --dtypes float32 --rows 1 8 --reps 40   # the C++ kernel's levers

A decode step's linears read every weight once, so their time is the kernel's read rate. For each dtype and row
count this times the candidate kernels over random weights of the model's own linear shapes (qkv and gate_up
fused, as minisgl loads them) and its LM head, alternating kernels between repetitions: oneDNN's packed kernel
(``prepack_weight``), the same with the rows padded to four (``min_packed_rows``), minisgl's C++ kernel over
column-blocked copies (``keep_blocked_copy``, where the kernels are built), ``F.linear`` on the plain ``[out, in]``
weight (what HF transformers runs) and, for bfloat16 on a CPU without bfloat16 arithmetic, oneDNN over float32
copies (``keep_float32_copy``). The table shows median GB/s (weight bytes / time) and marks the kernel the
eager engine's ``apply_linear`` runs after this process's probes (a compiled graph's linears are Inductor's
choice). The last column is that kernel's rate over the fastest one's; below 1, a faster kernel exists at these
shapes: the probes switch only past a 10% margin, padding is probed on AMX CPUs only, the blocked copies on 1 and
8 rows together, and five repetitions on a shared VM carry noise.

``--levers`` times the C++ kernel alone, as loaded and with each of its levers undone, alternated: each single-row
prefetch distance the probe chooses from (``single_row_prefetch_bytes``; several rows keep 16 KiB), the copies on
4 KiB pages (not ``block_weight``'s huge-page memory), the static split (no work sharing) and, for bfloat16 copies
made in pairs of ks for AVX512-BF16's dot products, the widened copies (``set_bfloat16_pairs(False)``). The table shows ms
per pass over the model's weights, with a memory read sample (``perf.read_bandwidth``) before and after: a shared
VM's bandwidth changes in phases, and a comparison holds within one.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable

import torch
import torch.nn.functional as F
from engines import DTYPES, MODELS, decode_linear_weights, dummy_model, model_paths
from perf import read_bandwidth
from rich.console import Console
from rich.table import Table

from minisgl.layers.amx_utils import (
    BLOCKED_MAX_ROWS,
    SINGLE_ROW_PREFETCH_CHOICES,
    alternating_seconds,
    apply_linear,
    block_weight,
    blocked_copies,
    blocked_linear,
    blocked_linear_is_faster,
    min_packed_rows,
    multiplies_in_float32,
    prepack_weight,
    single_row_prefetch_bytes,
)
from minisgl.layers.cpu_kernels import cpu_kernels_built

PACKED, PADDED, BLOCKED, PLAIN, FLOAT32 = KERNELS = (
    "oneDNN packed", "oneDNN padded to 4", "C++, blocked copy", "F.linear (HF)", "float32 copy",
)  # fmt: skip
Kernel = Callable[[list[torch.Tensor]], list[torch.Tensor]]  # one input per weight -> outputs


def linear_shapes(model_path: str) -> list[tuple[int, int]]:
    """``[out, in]`` of every linear weight and the LM head of minisgl's model for ``model_path``."""
    return [tuple(weight.shape) for weight, _ in decode_linear_weights(dummy_model(model_path))]


def kernel_variants(plain: list[torch.Tensor]) -> dict[str, Kernel]:
    """Each kernel, as a pass over all of ``plain``'s weights (one input of any row count per weight); the oneDNN
    ones only where oneDNN packs this dtype, the C++ one only where it is built."""
    kernels = {PLAIN: lambda xs: [F.linear(x, w) for x, w in zip(xs, plain)]}
    if cpu_kernels_built():
        blocked = [block_weight(w) for w in plain]
        kernels[BLOCKED] = lambda xs: [blocked_linear(x, b, None, len(w)) for x, b, w in zip(xs, blocked, plain)]
    if multiplies_in_float32(plain[0]):
        copies = [prepack_weight(w.float()) for w in plain]
        kernels[FLOAT32] = lambda xs: [apply_linear(x.float(), c).to(x.dtype) for x, c in zip(xs, copies)]
    packed = [prepack_weight(w) for w in plain]
    if packed[0].is_mkldnn:

        def onednn(xs: list[torch.Tensor]) -> list[torch.Tensor]:
            return [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for x, w in zip(xs, packed)]

        def padded(xs: list[torch.Tensor]) -> list[torch.Tensor]:
            rows = xs[0].shape[0]
            return [out[:rows] for out in onednn([F.pad(x, (0, 0, 0, max(0, 4 - rows))) for x in xs])]

        kernels = {PACKED: onednn, PADDED: padded, **kernels}
    return kernels


AS_LOADED, SMALL_PAGES, STATIC_SPLIT, WIDENED = "as loaded", "4 KiB pages", "static split", "bfloat16 widened"


def prefetch_lever(ahead: int) -> str:
    return f"{ahead // 1024} KiB ahead" if ahead else "no prefetch"


def other_distances() -> list[int]:
    """The single-row prefetch distances the probe did not choose."""
    return [ahead for ahead in SINGLE_ROW_PREFETCH_CHOICES if ahead != single_row_prefetch_bytes()]


def kernel_levers(plain: list[torch.Tensor]) -> dict[str, Kernel]:
    """The C++ kernel over ``plain``'s blocked copies as the probes set it up, and with one lever changed each: every
    other single-row prefetch distance (which only one row uses), the copies on 4 KiB pages, the static split and,
    where the copies are bfloat16 pairs of ks, the widened layout. Each pass sets the kernel's knobs it runs with;
    ``restore_levers`` puts back the loaded ones."""
    chosen = single_row_prefetch_bytes()
    huge = [block_weight(w) for w in plain]
    small_pages = [torch.empty_like(b).copy_(b) for b in huge]  # the CPU allocator's memory: no huge-page advice

    def run(copies: list[torch.Tensor], ahead: int, sharing: bool) -> Kernel:
        def kernel(xs: list[torch.Tensor]) -> list[torch.Tensor]:
            torch.ops.minisgl_cpu.set_single_row_prefetch(ahead)
            torch.ops.minisgl_cpu.set_work_sharing(sharing)
            return [blocked_linear(x, b, None, len(w)) for x, b, w in zip(xs, copies, plain)]

        return kernel

    distances = {prefetch_lever(ahead): run(huge, ahead, True) for ahead in other_distances()}
    levers = {AS_LOADED: run(huge, chosen, True), **distances, SMALL_PAGES: run(small_pages, chosen, True),
              STATIC_SPLIT: run(huge, chosen, False)}  # fmt: skip
    if huge[0].dim() == 4:  # pairs of ks (AVX512-BF16): against the widening path's layout
        pairs_before = torch.ops.minisgl_cpu.set_bfloat16_pairs(False)
        try:
            levers[WIDENED] = run([block_weight(w) for w in plain], chosen, True)
        finally:
            torch.ops.minisgl_cpu.set_bfloat16_pairs(pairs_before)
    return levers


def restore_levers() -> None:
    torch.ops.minisgl_cpu.set_single_row_prefetch(single_row_prefetch_bytes())
    torch.ops.minisgl_cpu.set_work_sharing(True)


def picked_kernel(dtype: torch.dtype, rows: int, kernels: dict[str, Kernel]) -> str:
    """The kernel ``apply_linear`` runs for ``rows`` rows of this dtype after this process's probes."""
    if rows <= BLOCKED_MAX_ROWS and BLOCKED in kernels and blocked_linear_is_faster(dtype):
        return BLOCKED
    if PACKED not in kernels:
        return FLOAT32 if rows > 1 and FLOAT32 in kernels else PLAIN
    return PADDED if rows < min_packed_rows() else PACKED


def time_kernels(kernels: dict[str, Kernel], xs: list[torch.Tensor], reps: int) -> dict[str, float]:
    """Median seconds of one pass per kernel, kernels alternating within each repetition, as the probes time."""
    seconds = alternating_seconds([lambda kernel=kernel: kernel(xs) for kernel in kernels.values()], reps)
    return dict(zip(kernels, seconds))


def lever_table(args: argparse.Namespace, paths: dict[str, str]) -> Table:
    """``--levers``: ms per pass of the C++ kernel over each model's weights, as loaded and with each lever undone."""
    chosen = prefetch_lever(single_row_prefetch_bytes())
    table = Table(title=f"C++ decode kernel, ms per pass over the weights (median); as loaded: single row {chosen}, "
                        "huge pages, work sharing")  # fmt: skip
    names = [AS_LOADED, *map(prefetch_lever, other_distances()), SMALL_PAGES, STATIC_SPLIT]
    names += [WIDENED] * ("bfloat16" in args.dtypes)  # its cells: "-" where the copies are not pairs
    for column in ("model", "dtype", "rows", "GB/s before", *names, "GB/s after"):
        table.add_column(column, justify="right")
    for model_name in args.models:
        shapes = linear_shapes(paths[model_name])
        for dtype_name in args.dtypes:
            plain = [torch.randn(shape).mul_(0.02).to(DTYPES[dtype_name]) for shape in shapes]
            levers = kernel_levers(plain)  # blocked once for every row count
            for rows in args.rows:
                # the prefetch distances change nothing past one row
                timed = {
                    n: k for n, k in levers.items() if rows == 1 or n not in map(prefetch_lever, other_distances())
                }
                xs = [torch.randn(rows, w.shape[1], dtype=w.dtype) for w in plain]
                before = read_bandwidth()
                try:
                    seconds = time_kernels(timed, xs, args.reps)
                finally:
                    restore_levers()
                cells = [f"{seconds[n] * 1e3:.2f}" if n in seconds else "-" for n in names]
                table.add_row(model_name, dtype_name, str(rows), f"{before / 1e9:.1f}", *cells,
                              f"{read_bandwidth() / 1e9:.1f}")  # fmt: skip
            del levers, timed  # the closures hold both copies of the weights
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["smollm2"], choices=MODELS)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 4, 8], help="decode batch sizes")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--levers", action="store_true", help="the C++ kernel alone, with each of its levers undone")
    args = parser.parse_args(argv)
    if min(args.rows) < 1 or args.reps < 1:
        parser.error("--rows and --reps: 1 or more")
    if args.levers and not cpu_kernels_built():
        parser.error("--levers times minisgl's C++ kernel, which did not build here (see the line above)")
    if args.levers:
        with tempfile.TemporaryDirectory(prefix="minisgl-kernels-") as scratch:
            Console(width=160).print(lever_table(args, model_paths(args.models, scratch)))
        return
    console = Console(width=160)  # piped to a file, rich would wrap every cell at 80 columns
    padding = "to 4 rows" if min_packed_rows() == 4 else "none"
    copies = ", ".join(f"{name} {'yes' if kept else 'no'}" for name, kept in blocked_copies().items())
    console.print(f"the probes here: oneDNN's 1-3 row inputs padded: {padding}; column-blocked copies for the C++ kernel "
                  f"(1-{BLOCKED_MAX_ROWS} rows): {copies}")  # fmt: skip
    # the weights' bytes in the row's dtype: the float32 copies read twice the bfloat16 bytes they are credited with
    table = Table(title="decode linears, GB/s of the dtype's weight bytes (median); * = the kernel apply_linear runs")
    offered = {name for d in args.dtypes for name in kernel_variants([torch.zeros(1, 1, dtype=DTYPES[d])])}
    shown = [name for name in KERNELS if name in offered]  # none that this CPU offers for none of the dtypes
    for column in ("model", "dtype", "rows", *shown, "picked / fastest"):
        table.add_column(column)
    with tempfile.TemporaryDirectory(prefix="minisgl-kernels-") as scratch:
        paths = model_paths(args.models, scratch)
        for model_name in args.models:
            shapes = linear_shapes(paths[model_name])
            for dtype_name in args.dtypes:
                dtype = DTYPES[dtype_name]
                plain = [torch.randn(shape).mul_(0.02).to(dtype) for shape in shapes]
                weight_bytes = sum(w.numel() * w.element_size() for w in plain)
                kernels = kernel_variants(plain)
                for rows in args.rows:
                    xs = [torch.randn(rows, w.shape[1], dtype=dtype) for w in plain]
                    # padding to four changes nothing from four rows on
                    timed = {n: k for n, k in kernels.items() if n != PADDED or rows < 4}
                    seconds = time_kernels(timed, xs, args.reps)
                    picked = picked_kernel(dtype, rows, kernels)
                    rate = {name: weight_bytes / s / 1e9 for name, s in seconds.items()}
                    cells = [f"{rate[n]:.1f}{' *' * (n == picked)}" if n in rate else "-" for n in shown]
                    table.add_row(model_name, dtype_name, str(rows), *cells, f"{rate[picked] / max(rate.values()):.2f}")
                del plain, kernels, timed  # the closures hold every copy of the weights
    console.print(table)


if __name__ == "__main__":
    main()
