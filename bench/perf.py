"""minisgl against HF transformers and against this machine's roofline, measured side by side in one run.

    python bench/perf.py                       # both models, both dtypes, all workloads (~65 min on 2 cores)
    python bench/perf.py --models dummy134 --dtypes float32 --workloads 1,128,32 --reps 3 --engines minisgl hf
    bash bench/cuda.sh                         # on a CUDA machine: HF equality there, then this with --device cuda

minisgl runs through the same code as ``bench_one_batch`` (``load_model`` + ``latency_test_run_once``), eagerly
(engine ``minisgl``) and with ``--enable-torch-compile`` (engine ``compiled``; it compiles in the warm-up, as
in the bench);
HF runs ``generate`` (greedy, sdpa attention, its default cache) on the same weights, each step timed by a
logits processor that stamps the clock as every new token's logits arrive. Each engine runs in a process of its
own, a fresh one for each model and dtype (``bench/engines.py``): minisgl's runners set their glibc heap settings
(``keep_freed_cpu_memory``) in theirs, and HF keeps glibc's defaults, as a user would run it. Engines alternate
between repetitions, each timed run right after an untimed prefill of the same workload in the same engine (as
``bench_one_batch`` times a run after its warm-up); medians are reported with min and max. The matmul peak (float32,
bfloat16) and the memory read bandwidth are measured in this parent process while the engines wait, under the heap
settings minisgl's engines have (as when all of it ran in one process): once before and after the run, and both
again right before every engine's run of every row, whose shares use the medians of its own samples. Results: a
table, and JSON (``--output``); each finished row is also kept in ``<output>.partial`` until then, so that a run
stopped by a dead engine or Ctrl-C is finished with ``--resume`` (``bench/progress.py``). With ``--device cuda``
every engine and probe runs on the GPU, timed with a synchronize around each measurement; ``smollm2-shape`` is
SmolLM2-135M's architecture with random weights, for machines that cannot fetch its GGUF (an offline GPU
machine). Same shapes, so the same bytes and FLOPs per step, and the same times (eager, 1,128,16, both models
alternating in one process, median of 8, real -> shape: float32 prefill 95.9 -> 95.7 ms, decode 23.36 -> 23.75;
bfloat16 66.4 -> 66.7, 14.10 -> 13.97).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile

import progress  # bench/progress.py
import torch
import torch.nn.functional as F
from engines import (  # bench/engines.py: this script's folder is first on sys.path
    CPU,
    DTYPES,
    ENGINES,
    MODELS,
    EngineDied,
    EngineProcess,
    best_time,
    meta_model,
    model_paths,
    run_times,
)
from rich.console import Console
from rich.table import Table
from roofline import (  # bench/roofline.py
    add_roofline_shares,
    decode_bytes,
    decode_kv_bytes,
    exact_prefill_flops,
    prefill_attention_flops,
)

from minisgl.bench_utils import OneLineErrorParser
from minisgl.layers.amx_utils import (
    MKL_GEMM_MIN_ROWS,
    apply_linear,
    blocked_copies,
    keep_float32_copy,
    min_packed_rows,
    mkl_gemm_is_faster,
    multiplies_in_float32,
    prepack_weight,
    single_row_prefetch_bytes,
)
from minisgl.utils.common import InputError, keep_freed_cpu_memory, resolve_device, write_whole

WORKLOADS = [(1, 128, 32), (8, 128, 32), (1, 512, 16), (32, 256, 16)]


def hands_back_gpu_memory(probe):
    """On CUDA, a probe's buffers go back to the driver as it returns: the engines, in their own processes, could not
    use the memory this process's caching allocator would keep."""

    @functools.wraps(probe)
    def measure(device: torch.device = CPU, *args, **kwargs):
        try:
            return probe(device, *args, **kwargs)
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()

    return measure


@hands_back_gpu_memory
def matmul_peak(device: torch.device = CPU, dtype: torch.dtype = torch.float32, reps: int = 5) -> float:
    """FLOP/s of the fastest run of the faster kernel (torch's ``F.linear``, or the one minisgl's linears use; on
    CUDA both are cuBLAS); a peak is what the machine can reach, so a median or a slower kernel would let shares
    pass 100%. A GPU needs a larger product than a CPU to reach its peak; its float32 is IEEE float32, not TF32
    (torch's default, and how both engines run).

    minisgl's kernel is oneDNN's packed one, or for bfloat16 on a CPU without bfloat16 arithmetic the float32
    copy of ``keep_float32_copy``: there the fastest bfloat16 product this machine has is a float32 one. The
    plain product is ``F.linear`` (``a @ b.T``), as HF's linears call it: torch's generic bfloat16 kernel runs
    ``a @ b`` at 0.3 GFLOP/s on an AVX2 EPYC (one 2048-square product: 55 s), ``F.linear`` at 20."""
    size = 8192 if device.type == "cuda" else 2048
    a, b = (torch.randn(size, size, dtype=dtype, device=device) for _ in range(2))
    packed = prepack_weight(b)
    keep_float32_copy(packed)
    plain, minisgl = (lambda: F.linear(a, b)), (lambda: apply_linear(a, packed))
    return 2 * size**3 / min(best_time(plain, reps, device), best_time(minisgl, reps, device))


def machine_peaks(device: torch.device = CPU, dtypes=tuple(DTYPES), reps: int = 5) -> dict:
    """``matmul_float32_flops`` and/or ``matmul_bfloat16_flops``: ``matmul_peak`` of each dtype the run measures
    (only those: a bfloat16 probe takes seconds on a CPU without bfloat16 arithmetic)."""
    return {f"matmul_{name}_flops": matmul_peak(device, DTYPES[name], reps) for name in dtypes}


@hands_back_gpu_memory
def read_bandwidth(device: torch.device = CPU, reps: int = 3) -> float:
    """Memory read bandwidth now: a 1 GiB matrix read by three kernels, the fastest kernel's median pass.

    Which kernel streams fastest depends on the CPU (Xeon VM: MKL's sgemv ~19 GB/s, oneDNN's packed GEMV at four
    rows ~21-34, a plain sum ~24-46; AMD EPYC VM: sgemv ~33, oneDNN and the sum alike). A shared VM's bandwidth
    changes between phases of seconds to minutes (the Xeon VM's drifted; the EPYC VM's jumps between ~50 and ~80
    GB/s with two threads, ~41 with one), so ``run_rows`` samples it right before every engine's run of every row
    and each row's floor uses the median of its own samples: a floor from a run-wide median was one that rows
    run in the other phase never had (an EPYC run's fast-phase row reached 113% of it). Allocated per call, so
    that the machine does not hold 2 GiB the engines never use. On CUDA the same readers run as cuBLAS and a
    reduction kernel, on a matrix in GPU memory, ten passes per sample.
    """
    # filled, not random: the values do not change the read time, and randn of 1 GiB takes seconds per sample
    matrix = torch.full((16384, 16384), 0.5, device=device)
    vector, rows = torch.randn(16384, device=device), torch.randn(4, 16384, device=device)
    packed = prepack_weight(matrix)
    readers = (lambda: torch.mv(matrix, vector), lambda: apply_linear(rows, packed), matrix.sum)
    # A GPU reads the GiB in a fraction of a millisecond, near the cost of the synchronize and the clock: time ten
    # reads back to back per sample.
    passes = 10 if device.type == "cuda" else 1
    seconds = min(statistics.median(run_times(lambda r=read: [r() for _ in range(passes)], reps, device))
                  for read in readers)  # fmt: skip
    return passes * matrix.numel() * 4 / seconds


def source_commit(root: str = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) -> str | None:
    """The commit of the minisgl tree at ``root`` (this script's), ``+changes`` when tracked files differ from it;
    None where the tree is not a git checkout of its own (a device machine gets a copy without its history)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, check=True).stdout.strip()

    try:
        if os.path.realpath(git("rev-parse", "--show-toplevel")) != os.path.realpath(root):
            return None  # the copy sits inside some other repository, whose commit is not minisgl's
        commit, changes = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+changes" if changes else "")


def machine_info(device: torch.device = CPU) -> dict:
    """The CPU (and GPU) the figures belong to: kernel choices and the shares differ from one to another."""
    fields = {}  # the first CPU's "model name", "cpu family", "model" (a VM's name alone may say only "AMD EPYC")
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    info = {
        "cpu": fields.get("model name", "unknown"),
        "cpu_family": fields.get("cpu family"),
        "cpu_model": fields.get("model"),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "amx": torch.cpu._is_amx_tile_supported(),
        "avx512_bf16": torch.cpu._is_avx512_bf16_supported(),
        # the start-up probes' kernel choices (minisgl.layers.linear), made here; each engine process makes its own
        "padded_rows": min_packed_rows(),
        "blocked_copies": blocked_copies(),
        "single_row_prefetch": single_row_prefetch_bytes(),  # bytes the C++ kernel prefetches one row's weights ahead
        "mkl_gemm_copies": mkl_gemm_is_faster(),
        "mkl_gemm_min_rows": MKL_GEMM_MIN_ROWS,
        # batched bfloat16 rows multiply float32 copies (a CPU without bfloat16 arithmetic)
        "bfloat16_float32_copies": device.type == "cpu" and multiplies_in_float32(torch.empty(0, dtype=torch.bfloat16)),
        "torch": torch.__version__,
    }
    if device.type == "cuda":
        info.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda)
    return info


def summarize(values):
    """Median, min and max of a row's repetitions, and the repetitions themselves in the order they ran."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "samples": values}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineErrorParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=["smollm2", "dummy134"],
        choices=MODELS,
        help="smollm2: the default GGUF; smollm2-shape: its architecture, random weights",
    )
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument(
        "--workloads",
        nargs="+",
        default=[",".join(map(str, w)) for w in WORKLOADS],
        help="batch,input,output per workload (output 2 or more)",
    )
    parser.add_argument("--reps", type=int, default=5, help="repetitions per engine and workload, engines alternating")
    parser.add_argument(
        "--engines",
        nargs="+",
        default=list(ENGINES),
        choices=list(ENGINES),
        help="minisgl: eager; compiled: --enable-torch-compile; hf: HF transformers generate",
    )
    parser.add_argument("--output", default="bench/results.json", help="the JSON results (the table goes to stdout)")
    parser.add_argument("--resume", action="store_true",
                        help="finish the run that stopped with its rows kept in <output>.partial")  # fmt: skip
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: where every engine and probe runs")
    args = parser.parse_args(argv)
    try:
        workloads = [tuple(int(x) for x in w.split(",")) for w in args.workloads]
        assert all(len(w) == 3 and min(w) > 0 for w in workloads)
    except (ValueError, AssertionError):
        parser.error(f"--workloads {' '.join(args.workloads)}: each must be batch,input,output (e.g. 8,128,32)")
    if min(output for _, _, output in workloads) < 2:
        parser.error(f"--workloads {' '.join(args.workloads)}: an output of at least 2 tokens, so that decode is timed")
    if args.reps < 1:
        parser.error(f"--reps {args.reps}: at least 1")
    args.workloads = workloads
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        parser.error(f"--output {args.output}: its folder does not exist; create it or write elsewhere")
    return args


def cli(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        # The random-weight checkpoints live as long as the run (a 134M float32 one is half a GB).
        with tempfile.TemporaryDirectory(prefix="minisgl-perf-") as scratch:
            main(args, resolve_device(args.device), scratch)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except EngineDied as e:
        print(f"error: {e}. {progress.kept_note(args.output)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted. {progress.kept_note(args.output)}", file=sys.stderr)
        return 130
    return 0


def main(args: argparse.Namespace, device: torch.device, scratch: str) -> None:
    keep_freed_cpu_memory()  # for the probes here only: settings made in this process do not reach spawned engines
    machine = machine_info(device)
    # the commit before the run: the tree an hour-long run measured is the one it started from
    run = {"commit": source_commit(), "device": device.type, "engines": args.engines, "reps": args.reps,
           "cpu": f"{machine['cpu']}, {machine['cores']} cores"}  # fmt: skip
    kept = progress.start(args.output, args.resume, run)  # refuses a mismatched --resume before any engine starts
    done = {progress.row_key(row) for row in kept["rows"]}
    # A shared machine's matmul peaks drift: the run keeps the best of those measured before and after the engines
    # ran (in every session of a resumed run), and every bandwidth measured.
    kept["peaks"] = best_peaks(kept.get("peaks", {}), machine_peaks(device, args.dtypes))
    kept["read_bandwidth_samples"] = [*kept.get("read_bandwidth_samples", []), read_bandwidth(device)]
    kept.setdefault("machine", machine)
    paths = model_paths(args.models, scratch)
    max_tokens = max(b * (i + o) for b, i, o in args.workloads) + 64  # the KV pool every workload fits in
    for model_name in args.models:
        for dtype_name in args.dtypes:
            todo = [w for w in args.workloads if (model_name, dtype_name, *w) not in done]
            if not todo:
                continue
            # Fresh engine processes for each model and dtype: what one left behind (compiled graphs, each with its
            # own copy of the weights; a fragmented heap) cannot crowd the next out of memory.
            with contextlib.ExitStack() as stack:
                engines = {}
                for name in args.engines:
                    # Started one at a time: an engine's load, and the kernel probes in it, never share the cores
                    # with another engine's start-up (a probe timed so once chose the kernel that lost).
                    engines[name] = stack.enter_context(EngineProcess(name, device))
                    engines[name].call("load", paths[model_name], dtype_name, max_tokens)
                counted = meta_model(paths[model_name], DTYPES[dtype_name])  # FLOPs and bytes, on no memory
                for workload in todo:
                    kept["rows"].append(run_row(args, device, engines, model_name, dtype_name, counted, workload))
                    progress.save(args.output, kept)
    rows, peaks = kept["rows"], best_peaks(kept["peaks"], machine_peaks(device, args.dtypes))
    bandwidths = [*kept["read_bandwidth_samples"], *(b for row in rows for b in row["read_bandwidth_samples"]),
                  read_bandwidth(device)]  # fmt: skip
    peaks["read_bandwidth_bytes"], peaks["read_bandwidth_samples"] = statistics.median(bandwidths), bandwidths
    print_table(rows, peaks)
    # minisgl's eager engine replays its decodes from CUDA graphs on CUDA (ServerArgs' default there)
    results = {"commit": run["commit"], "machine": kept["machine"], "device": device.type, "process_per_engine": True,
               "warm_up_before_each_run": True, "minisgl_cuda_graph": device.type == "cuda", "peaks": peaks,
               "rows": rows}  # fmt: skip
    write_whole(args.output, lambda f: json.dump(results, f, indent=1))
    progress.finish(args.output)
    print(f"written {args.output}")


def best_peaks(*measured: dict) -> dict:
    """Each matmul peak's best measurement."""
    return {key: max(m[key] for m in measured if key in m) for key in {k for m in measured for k in m}}


def run_row(args, device: torch.device, engines: dict, model_name: str, dtype_name: str, counted, workload) -> dict:
    """One workload's row for a model and dtype the engines have loaded: every engine's repetitions, alternating.
    ``counted`` is the model on the meta device, for the row's FLOPs and bytes."""
    b, i, o = workload
    for engine in engines.values():
        engine.call("run", b, i, min(o, 4))  # warm-up (and compile), as the bench does
    samples, linears, prefill_parts, row_bandwidths, row_peaks = {name: [] for name in engines}, [], [], [], []
    for _ in range(args.reps):  # alternate engines so drifting machine load hits all alike
        for name, engine in engines.items():
            # the bandwidth and matmul peak this run is about to have
            row_bandwidths.append(read_bandwidth(device))
            row_peaks.append(matmul_peak(device, DTYPES[dtype_name], reps=2))
            # An untimed prefill of the same workload first, so the timed run follows the engine's own work, as
            # in bench_one_batch (a warm-up, then the run), not the probes and another engine's: on a 2-core AMD
            # EPYC, SmolLM2 bfloat16 1,128,8, seven alternating runs each, prefill median cold -> warmed up:
            # minisgl 60.1 -> 52.0 ms, HF 65.4 -> 62.0 ms; decode steps unchanged (13.2, 19.6-19.7 ms).
            engine.call("run", b, i, 2)
            samples[name].append(engine.call("run", b, i, o))
        if "minisgl" in engines:
            linears.append(engines["minisgl"].call("linears", b))
            prefill_parts.append(engines["minisgl"].call("prefill_parts", b, i))
    row = {"model": model_name, "dtype": dtype_name, "batch": b, "input": i, "output": o}
    row["probes"] = {name: engine.call("probes") for name, engine in engines.items() if name != "hf"}
    for name, values in samples.items():
        row[f"{name}_prefill_s"] = summarize([v[0] for v in values])
        row[f"{name}_decode_s"] = summarize([v[1] for v in values])
    if linears:
        row["decode_linears_s"] = summarize(linears)
        row["prefill_linears_s"] = summarize([part[0] for part in prefill_parts])
        row["prefill_attention_s"] = summarize([part[1] for part in prefill_parts])
    row["prefill_flops"], row["decode_bytes"] = exact_prefill_flops(counted, b, i), decode_bytes(counted)
    row["prefill_attention_flops"] = prefill_attention_flops(counted, b, i)
    row["decode_kv_bytes"] = decode_kv_bytes(counted, b, i, o)
    row["read_bandwidth_bytes"] = statistics.median(row_bandwidths)
    row["read_bandwidth_samples"] = row_bandwidths
    row["matmul_peak_flops"], row["matmul_peak_samples"] = statistics.median(row_peaks), row_peaks
    add_speedups(row)
    add_roofline_shares(row)
    speedups = ", ".join(f"{key} x{value:.2f}" for key, value in row.items() if key.endswith("speedup"))
    print(f"{model_name} {dtype_name} {b},{i},{o}: {speedups} (HF time / ours)", flush=True)
    return row


def add_speedups(row: dict) -> None:
    """HF time / minisgl time: ``prefill_speedup`` and ``decode_speedup`` (eager), ``compiled_*_speedup``."""
    for engine, prefix in (("minisgl", ""), ("compiled", "compiled_")):
        if f"{engine}_prefill_s" in row and "hf_prefill_s" in row:
            for phase in ("prefill", "decode"):
                row[f"{prefix}{phase}_speedup"] = row[f"hf_{phase}_s"]["median"] / row[f"{engine}_{phase}_s"]["median"]


def print_table(rows, peaks) -> None:
    matmul = ", ".join(
        f"{short} {peaks[f'matmul_{name}_flops'] / 1e9:.0f} GFLOP/s"
        for name, short in (("float32", "fp32"), ("bfloat16", "bf16"))
        if f"matmul_{name}_flops" in peaks
    )
    table = Table(title=(f"matmul peak {matmul} (the run's best); "
                         f"read bandwidth {peaks['read_bandwidth_bytes'] / 1e9:.1f} GB/s (median); each row's "
                         "shares use its own samples of both"))  # fmt: skip
    engines = [e for e in ENGINES if rows and f"{e}_prefill_s" in rows[0]]
    speedups = [key for key in ("prefill_speedup", "compiled_prefill_speedup", "decode_speedup",
                                "compiled_decode_speedup") if rows and key in rows[0]]  # fmt: skip
    columns = ["model", "dtype", "B,I,O"]
    for phase, share in (("prefill", "% peak"), ("decode", "% floor")):
        columns += [f"{phase} ms {ENGINES[e]}" + (" [min-max]" if e != "hf" else "") for e in engines]
        columns += [f"{share} {ENGINES[e]}" for e in engines]
    linears = bool(rows) and "decode_linears_s" in rows[0]
    columns += ["decode linears ms (GB/s)", "prefill linears / attention ms (ceiling)"] * linears
    columns += [key.replace("_speedup", " x").replace("_", " ") for key in speedups]
    for col in columns:
        table.add_column(col, justify="right")
    for r in rows:
        cells = [r["model"], r["dtype"], f"{r['batch']},{r['input']},{r['output']}"]
        for phase, share in (("prefill", "prefill_peak_share"), ("decode", "decode_floor_share")):
            for e in engines:
                t = r[f"{e}_{phase}_s"]
                span = f" [{t['min'] * 1e3:.1f}-{t['max'] * 1e3:.1f}]" if e != "hf" else ""
                cells.append(f"{t['median'] * 1e3:.1f}{span}")
            cells += [f"{r[f'{e}_{share}']:.0%}" for e in engines]
        if linears:
            cells.append(f"{r['decode_linears_s']['median'] * 1e3:.1f} ({r['decode_linears_read_rate'] / 1e9:.1f})")
            parts = (r[f"prefill_{part}_s"]["median"] * 1e3 for part in ("linears", "attention"))
            cells.append("{:.1f} / {:.1f}".format(*parts) + f" ({r['prefill_ceiling_share']:.0%})")
        cells += [f"{r[key]:.2f}" for key in speedups]
        table.add_row(*cells)
    Console(width=300).print(table)


if __name__ == "__main__":
    sys.exit(cli())
