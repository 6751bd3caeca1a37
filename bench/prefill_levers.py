"""The two CPU prefill levers, each switched off and on in one process: what each buys, side by side.

    python bench/prefill_levers.py                                  # SmolLM2 bfloat16, eager (~3 min on 2 cores)
    python bench/prefill_levers.py --models dummy134 --dtypes float32 --workloads 32,256 --compiled

*tiled attention* is ``causal_prefill_attention`` against SDPA (``TILED_PREFILL_DTYPES``),
*MLP blocks* is ``LlamaMLP``'s row blocks against one block (``_MLP_BLOCK_BYTES``). Each variant runs the same
``bench_one_batch`` path as ``bench/perf.py``, alternating between repetitions on one loaded model; the table
shows median prefill times and the ratio off / on (above 1: the lever helps). With ``--compiled`` each variant
compiles its own graph in the warm-up.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics

from perf import DTYPES, model_dirs, run_minisgl
from rich.console import Console
from rich.table import Table

import minisgl.layers.attention.torch_native_backend as backend_module
from minisgl.bench_one_batch import load_model
from minisgl.models import llama
from minisgl.server_args import ServerArgs

LEVERS = {
    "tiled attention": (backend_module, "TILED_PREFILL_DTYPES", frozenset()),
    "MLP blocks": (llama, "_MLP_BLOCK_BYTES", 1 << 62),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["smollm2"], choices=["smollm2", "dummy134"])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16"], choices=list(DTYPES))
    parser.add_argument("--workloads", nargs="+", default=["8,128", "1,512", "32,256"], help="batch,input")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--compiled", action="store_true", help="with --enable-torch-compile")
    args = parser.parse_args()
    workloads = [tuple(int(x) for x in w.split(",")) for w in args.workloads]
    table = Table(title="prefill ms, median: lever off / on")
    for column in ("model", "dtype", "batch, input", "lever", "off", "on", "off / on"):
        table.add_column(column)
    models = model_dirs()
    for model_name in args.models:
        for dtype in args.dtypes:
            server_args = ServerArgs(model_path=models[model_name][0], dtype=dtype, enable_torch_compile=args.compiled,
                                     max_total_tokens=max(b * (i + 2) for b, i in workloads) + 64)  # fmt: skip
            with contextlib.redirect_stdout(io.StringIO()):
                runner, _ = load_model(server_args, 0)
            for lever, (module, name, off) in LEVERS.items():
                on = getattr(module, name)
                for batch, input_len in workloads:
                    times = {off: [], on: []}
                    for value in [off, on] * (args.reps + 1):  # the first pass of each is the warm-up
                        setattr(module, name, value)
                        times[value].append(run_minisgl(runner, batch, input_len, 2, 32000)[0])
                    setattr(module, name, on)
                    off_s, on_s = (statistics.median(times[v][1:]) for v in (off, on))
                    table.add_row(model_name, dtype, f"{batch}, {input_len}", lever, f"{off_s * 1e3:.1f}",
                                  f"{on_s * 1e3:.1f}", f"{off_s / on_s:.2f}")  # fmt: skip
    Console().print(table)


if __name__ == "__main__":
    main()
