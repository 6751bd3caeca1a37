"""The CPU prefill levers, each switched off and on side by side: what each buys.

    python bench/prefill_levers.py                                  # SmolLM2 bfloat16, eager (~3 min on 2 cores)
    python bench/prefill_levers.py --models dummy134 --dtypes float32 --workloads 32,256 --compiled
    python bench/prefill_levers.py --allocator                      # glibc's settings instead (~2 min)
    python bench/prefill_levers.py --levers "prefill kernel" --dtypes float32 bfloat16 --workloads 1,128 1,512

*prefill kernel* is minisgl's C++ causal attention (``cpu_prefill.py``) against what runs without it, the tiles or
SDPA (``MAX_TOKENS`` 0: no extend fits it); *tiled attention* is ``causal_prefill_attention`` against SDPA
(``TILED_PREFILL_DTYPES``), with the prefill kernel off, as where it is not built,
*MLP blocks* is ``LlamaMLP``'s row blocks against one block (``_MLP_BLOCK_BYTES``), *MKL GEMM copies* is MKL's GEMM
on the plain float32 weights for long prefills against oneDNN's packed kernel (``MKL_GEMM_MIN_ROWS``; compiled, the
opaque ``plain_weight_linear``; only where ``mkl_gemm_is_faster``, elsewhere both variants are the same). Each variant runs the same
``bench_one_batch`` path as ``bench/perf.py``, alternating between repetitions on one loaded model; the table
shows median prefill times and the ratio off / on (above 1: the lever helps). With ``--compiled`` each variant
compiles its own graph in the warm-up. *heap reuse* (``--allocator``) is ``keep_freed_cpu_memory``
against glibc's defaults; malloc's settings cannot be put back in a process, so each repetition of each variant
loads the model in a process of its own, alternating (with ``--compiled``, each of them compiles: minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile

from engines import DTYPES, model_paths, run_minisgl
from rich.console import Console
from rich.table import Table

import minisgl.layers.amx_utils as amx_utils
import minisgl.layers.attention.cpu_prefill as cpu_prefill
import minisgl.layers.attention.tiled_prefill as tiled_prefill
from minisgl.bench_one_batch import load_model
from minisgl.models import llama
from minisgl.server_args import ServerArgs
from minisgl.utils.common import USER_MALLOC_SETTINGS

LEVERS = {
    "prefill kernel": (cpu_prefill, "MAX_TOKENS", 0),
    "tiled attention": (tiled_prefill, "TILED_PREFILL_DTYPES", frozenset()),
    "MLP blocks": (llama, "_MLP_BLOCK_BYTES", 1 << 62),
    "MKL GEMM copies": (amx_utils, "MKL_GEMM_MIN_ROWS", 1 << 62),
}
# Levers held off while another is timed: the tiles serve only the extends the prefill kernel leaves them.
HELD_OFF = {"tiled attention": ["prefill kernel"]}


def load_runner(model_path: str, dtype: str, compiled: bool, workloads):
    server_args = ServerArgs(model_path=model_path, dtype=dtype, enable_torch_compile=compiled,
                             max_total_tokens=max(b * (i + 2) for b, i in workloads) + 64)  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        return load_model(server_args, 0)[0]


def in_process_levers(runner, workloads, reps: int, levers=tuple(LEVERS)):
    """(lever, batch, input_len, off seconds, on seconds) for each in-process lever, variants alternating."""
    for lever in levers:
        module, name, off = LEVERS[lever]
        on = getattr(module, name)
        held = [(LEVERS[other], getattr(*LEVERS[other][:2])) for other in HELD_OFF.get(lever, [])]
        for (held_module, held_name, held_off), _ in held:
            setattr(held_module, held_name, held_off)
        for batch, input_len in workloads:
            times = {off: [], on: []}
            for value in [off, on] * (reps + 1):  # the first pass of each is the warm-up
                setattr(module, name, value)
                times[value].append(run_minisgl(runner, batch, input_len, 2, 32000)[0])
            setattr(module, name, on)
            yield lever, batch, input_len, *(statistics.median(times[v][1:]) for v in (off, on))
        for (held_module, held_name, _), value in held:
            setattr(held_module, held_name, value)


def allocator_child(args, workloads) -> None:
    """One repetition of one variant of ``--allocator``: a prefill per workload, as a ``RESULT`` line on stdout."""
    runner = load_runner(args.model_path, args.dtypes[0], args.compiled, workloads)
    seconds = []
    for batch, input_len in workloads:
        run_minisgl(runner, batch, input_len, 2, 32000)  # warm-up
        seconds.append(run_minisgl(runner, batch, input_len, 2, 32000)[0])
    print("RESULT", json.dumps(seconds))


def allocator_lever(model_path: str, dtype: str, args, workloads):
    """As ``in_process_levers`` for ``keep_freed_cpu_memory``: a fresh process per repetition and variant."""
    times = {"off": [], "on": []}
    for variant in ["off", "on"] * args.reps:
        command = [sys.executable, __file__, "--child", "--model-path", model_path, "--dtypes", dtype,
                   "--workloads", *args.workloads] + ["--compiled"] * args.compiled  # fmt: skip
        # "off": the runner's own opt-out, so glibc keeps its defaults; "on": none of the variables that skip it
        env = {k: v for k, v in os.environ.items() if k not in USER_MALLOC_SETTINGS}
        env["MINISGL_KEEP_FREED_CPU_MEMORY"] = "0" if variant == "off" else "1"
        run = subprocess.run(command, capture_output=True, text=True, env=env)
        if run.returncode != 0:
            sys.exit(f"the {variant} run failed:\n{run.stderr}")
        result = next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))
        times[variant].append(json.loads(result.removeprefix("RESULT ")))
    for k, (batch, input_len) in enumerate(workloads):
        off_s, on_s = (statistics.median(run[k] for run in times[v]) for v in ("off", "on"))
        yield "heap reuse", batch, input_len, off_s, on_s


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["smollm2"], choices=["smollm2", "dummy134"])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16"], choices=list(DTYPES))
    parser.add_argument("--workloads", nargs="+", default=["8,128", "1,512", "32,256"], help="batch,input")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--levers", nargs="+", default=list(LEVERS), choices=list(LEVERS), help="in-process levers")
    parser.add_argument("--compiled", action="store_true", help="with --enable-torch-compile")
    parser.add_argument("--allocator", action="store_true", help="compare glibc's settings, not the levers")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-path", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    workloads = [tuple(int(x) for x in w.split(",")) for w in args.workloads]
    if args.child:
        return allocator_child(args, workloads)
    table = Table(title="prefill ms, median: lever off / on")
    for column in ("model", "dtype", "batch, input", "lever", "off", "on", "off / on"):
        table.add_column(column)
    with tempfile.TemporaryDirectory(prefix="minisgl-levers-") as scratch:  # the --allocator children read it too
        models = model_paths(args.models, scratch)
        for model_name in args.models:
            for dtype in args.dtypes:
                path = models[model_name]
                if args.allocator:
                    results = allocator_lever(path, dtype, args, workloads)
                else:
                    runner = load_runner(path, dtype, args.compiled, workloads)
                    results = in_process_levers(runner, workloads, args.reps, args.levers)
                for lever, batch, input_len, off_s, on_s in results:
                    table.add_row(model_name, dtype, f"{batch}, {input_len}", lever, f"{off_s * 1e3:.1f}",
                                  f"{on_s * 1e3:.1f}", f"{off_s / on_s:.2f}")  # fmt: skip
    Console().print(table)


if __name__ == "__main__":
    main()
