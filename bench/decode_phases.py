"""Decode-step phases beside the bandwidth probe: one engine's runs of one workload, each between two probes.

    python bench/decode_phases.py                      # compiled dummy134 float32, 1,128,32, six runs (~3 min)
    python bench/decode_phases.py --engine minisgl --model smollm2 --runs 4

A shared VM's memory bandwidth changes in phases, so ``bench/perf.py`` samples ``read_bandwidth`` before every run
and holds each row to its own samples. This shows whether the decode step has phases the probe misses: the same
loaded engine runs the same workload again and again, each run's median step printed between the probe samples
taken right before and right after it. Steps that swing while the samples stay level are phases of the step's own
(the results page explains what that does to a row's decode share).
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from engines import DTYPES, MODELS, Engine, model_paths
from perf import read_bandwidth
from rich.console import Console
from rich.table import Table


def measure(engine: Engine, workload: tuple[int, int, int], runs: int) -> list[tuple[float, float, float]]:
    """(probe before, median decode step seconds, probe after) per run, after one warm-up run (and compile)."""
    engine.run(*workload)
    out = []
    for _ in range(runs):
        before = read_bandwidth()
        step = engine.run(*workload)[1]
        out.append((before, step, read_bandwidth()))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", default="compiled", choices=["minisgl", "compiled"])
    parser.add_argument("--model", default="dummy134", choices=MODELS)
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    parser.add_argument("--workload", default="1,128,32", help="batch,input,output (output 2 or more)")
    parser.add_argument("--runs", type=int, default=6)
    args = parser.parse_args(argv)
    try:
        workload = tuple(int(x) for x in args.workload.split(","))
        assert len(workload) == 3 and min(workload) > 0 and workload[2] >= 2 and args.runs >= 1
    except (ValueError, AssertionError):
        parser.error(f"--workload {args.workload} --runs {args.runs}: batch,input,output with output 2+, runs 1+")
    with tempfile.TemporaryDirectory(prefix="minisgl-phases-") as scratch:
        engine = Engine(args.engine, torch.device("cpu"))
        batch, input_len, output_len = workload
        engine.load(model_paths([args.model], scratch)[args.model], args.dtype, batch * (input_len + output_len) + 64)
        results = measure(engine, workload, args.runs)
    table = Table(title=f"{args.engine} {args.model} {args.dtype} {args.workload}: decode step against the probe")
    for column in ("run", "probe before GB/s", "median step ms", "probe after GB/s"):
        table.add_column(column, justify="right")
    for i, (before, step, after) in enumerate(results):
        table.add_row(str(i + 1), f"{before / 1e9:.1f}", f"{step * 1e3:.2f}", f"{after / 1e9:.1f}")
    Console().print(table)


if __name__ == "__main__":
    main()
