"""minisgl against HF transformers and against this machine's roofline, measured side by side in one run.

    python bench/perf.py                       # both models, both dtypes, all workloads (~30 min on 2 cores)
    python bench/perf.py --models dummy134 --dtypes float32 --workloads 1,128,32 --reps 3 --engines minisgl hf
    bash bench/cuda.sh                         # on a CUDA machine: HF equality there, then this with --device cuda

minisgl runs through the same code as ``bench_one_batch`` (``load_model`` + ``latency_test_run_once``), eagerly
(engine ``minisgl``) and with ``--enable-torch-compile`` (engine ``compiled``; it compiles in the warm-up, as
in the bench);
HF runs ``generate`` (greedy, sdpa attention, its default cache) on the same weights, each step timed by a
logits processor that stamps the clock as every new token's logits arrive. Engines alternate
between repetitions; medians are reported with min and max. The matmul peak (float32, bfloat16) and
the memory read bandwidth are measured in the same process, all of it under the glibc heap settings a
minisgl runner makes on CPU (``keep_freed_cpu_memory``; process-wide, so HF's runs get them too). Results: a
table, and JSON (``--output``). With ``--device cuda`` every engine and probe runs on the GPU, timed with a
synchronize around each measurement; ``smollm2-shape`` is SmolLM2-135M's architecture with random weights, for
machines that cannot fetch its GGUF (an offline GPU machine). Same shapes, so the same bytes and FLOPs per step, and
the same times (eager, 1,128,16, both models alternating in one process, median of 8, real -> shape: float32
prefill 95.9 -> 95.7 ms, decode 23.36 -> 23.75; bfloat16 66.4 -> 66.7, 14.10 -> 13.97).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from functools import partial

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LogitsProcessor, LogitsProcessorList  # noqa: E402

from minisgl.bench_one_batch import latency_test_run_once, load_model, prepare_synthetic_inputs_for_latency_test  # noqa: E402
from minisgl.bench_utils import OneLineErrorParser  # noqa: E402
from minisgl.layers.linear import ReplicatedLinear, RowParallelLinear, apply_linear, prepack_weight  # noqa: E402
from minisgl.model_loader.default_model import default_model_path  # noqa: E402
from minisgl.server_args import ServerArgs  # noqa: E402
from minisgl.utils.common import (  # noqa: E402
    InputError,
    keep_freed_cpu_memory,
    resolve_device,
    synchronize,
    write_whole,
)

WORKLOADS = [(1, 128, 32), (8, 128, 32), (1, 512, 16), (32, 256, 16)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ENGINES = {"minisgl": "eager", "compiled": "compiled", "hf": "HF"}  # engine -> its short name in the table
CPU = torch.device("cpu")


def run_times(fn, reps: int, device: torch.device = CPU) -> list[float]:
    fn()
    times = []
    for _ in range(reps):
        synchronize(device)
        tic = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - tic)
    return times


def best_time(fn, reps: int, device: torch.device = CPU) -> float:
    return min(run_times(fn, reps, device))


def machine_peaks(device: torch.device = CPU, reps: int = 5) -> dict:
    """Matmul peaks: the fastest run of the faster kernel (MKL's matmul, or the oneDNN one minisgl's linears
    use; on CUDA both are cuBLAS); a peak is what the machine can reach, so a median or a slower kernel would let
    shares pass 100%. A GPU needs a larger product than a CPU to reach its peak; its float32 is IEEE float32, not
    TF32 (torch's default, and how both engines run)."""
    size = 8192 if device.type == "cuda" else 2048
    peaks = {}
    for name, dtype in DTYPES.items():
        a, b = (torch.randn(size, size, dtype=dtype, device=device) for _ in range(2))
        packed = prepack_weight(b)
        plain, onednn = (lambda a=a, b=b: a @ b), (lambda a=a, w=packed: apply_linear(a, w))
        seconds = min(best_time(plain, reps, device), best_time(onednn, reps, device))
        peaks[f"matmul_{name}_flops"] = 2 * size**3 / seconds
    return peaks


def read_bandwidth(device: torch.device = CPU, reps: int = 3) -> float:
    """Memory read bandwidth now: a 1 GiB matrix read by three kernels, the fastest kernel's median pass.

    Which kernel streams fastest depends on the CPU (Xeon VM: MKL's sgemv ~19 GB/s, oneDNN's packed GEMV at four
    rows ~21-34, a plain sum ~24-46; AMD EPYC VM: sgemv ~33, oneDNN and the sum alike). A shared VM's bandwidth
    changes between phases of seconds to minutes (the Xeon VM's drifted; the EPYC VM's jumps between ~50 and ~80
    GB/s with two threads, ~41 with one), so ``main`` samples it right before every engine's run of every row
    and each row's floor uses the median of its own samples: a floor from a run-wide median was one that rows
    run in the other phase never had (an EPYC run's fast-phase row reached 113% of it). Allocated per call, so
    that the engines do not run beside 2 GiB they never use. On CUDA the same readers run as cuBLAS and a
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


def machine_info(device: torch.device = CPU) -> dict:
    """The CPU (and GPU) the figures belong to: kernel choices and the shares differ from one to another."""
    names = []
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    info = {
        "cpu": names[0] if names else "unknown",
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "amx": torch.cpu._is_amx_tile_supported(),
        "avx512_bf16": torch.cpu._is_avx512_bf16_supported(),
        "torch": torch.__version__,
    }
    if device.type == "cuda":
        info.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda)
    return info


def decode_linear_weights(model) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(weight, bias) of every linear layer of a loaded minisgl model and of its LM head, as its kernels read them."""
    layers = [(m.weight, m.bias) for m in model.modules() if isinstance(m, (ReplicatedLinear, RowParallelLinear))]
    head = model.lm_head.packed_weight if model.lm_head.packed_weight is not None else model.lm_head.weight
    return [*layers, (head, None)]


def decode_linears_time(model_runner, batch: int) -> float:
    """One decode step's weight reads alone: ``decode_linear_weights`` of the eager engine's model, with its own
    prepacked weights through ``apply_linear``, on ``batch`` rows (the fastest of three passes).

    Set beside the step time, it splits a decode step into what the linear kernels need to stream the weights and
    everything else (attention, norms, RoPE, framework time); set beside the floor, it shows how fast those
    kernels read memory.
    """
    layers = decode_linear_weights(model_runner.model)
    device = layers[0][0].device
    inputs = [torch.randn(batch, weight.shape[1], dtype=weight.dtype, device=device) for weight, _ in layers]

    def step():
        for (weight, bias), x in zip(layers, inputs):
            apply_linear(x, weight, bias)

    if device.type == "cuda":
        # Launched one by one, a step's ~200 small GEMMs take the CPU longer to queue than the GPU to run; replayed
        # as one CUDA graph, the timing is the GPU's reads.
        step()  # cuBLAS sets up its handles and workspaces before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        step = graph.replay
    return best_time(step, 3, device)


# Random-weight Llamas: the dummy 134M shape of issue #5, and SmolLM2-135M's own shape (its GGUF's config, which
# tests/test_bench_perf.py checks) for machines that cannot fetch the GGUF.
RANDOM_LLAMAS = {
    "dummy134": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                     num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=2048,
                     tie_word_embeddings=False),
    "smollm2-shape": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                          rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
                          tie_word_embeddings=True),
}  # fmt: skip
MODELS = ["smollm2", *RANDOM_LLAMAS]


def _save_word_tokenizer(directory: str) -> None:
    """A one-word tokenizer: bench_one_batch loads one, and the workload is synthetic ids that never meet it."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>").save_pretrained(directory)


def model_dirs(names: list[str], scratch: str) -> dict:
    """The chosen models, as (model_path for minisgl, loader for the same weights in HF); random-weight ones are
    saved under ``scratch``."""
    models = {}
    if "smollm2" in names:
        smol = default_model_path()
        directory, name = smol.rsplit("/", 1)
        models["smollm2"] = (smol, lambda dtype: AutoModelForCausalLM.from_pretrained(directory, gguf_file=name,
                                                                                      dtype=dtype))  # fmt: skip
    for model_name in (n for n in names if n in RANDOM_LLAMAS):
        path = os.path.join(scratch, model_name)
        torch.manual_seed(0)
        config = LlamaConfig(**RANDOM_LLAMAS[model_name], architectures=["LlamaForCausalLM"])
        AutoModelForCausalLM.from_config(config).save_pretrained(path)
        _save_word_tokenizer(path)
        models[model_name] = (path, lambda dtype, path=path: AutoModelForCausalLM.from_pretrained(path, dtype=dtype))
    return models


def exact_prefill_flops(model, batch: int, input_len: int) -> float:
    cfg = model.config
    layer_params = sum(p.numel() for n, p in model.named_parameters() if ".layers." in n)
    attention = 2 * input_len**2 * cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads)
    per_seq = 2 * layer_params * input_len + cfg.num_hidden_layers * attention + 2 * cfg.hidden_size * cfg.vocab_size
    return batch * per_seq


def decode_bytes(model) -> int:
    """Bytes a decode step must read: every weight but the embedding table (the LM head counts)."""
    embed = model.get_input_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    tied = model.config.tie_word_embeddings
    return total if tied else total - embed.numel() * embed.element_size()


def run_minisgl(runner, batch, input_len, output_len, vocab):
    reqs = prepare_synthetic_inputs_for_latency_test(batch, input_len, output_len, vocab, seed=0)
    with contextlib.redirect_stdout(io.StringIO()):
        r = latency_test_run_once("perf", runner, print, reqs, batch, input_len, output_len, 0, False, False,
                                  ("CPU",), "", "all")  # fmt: skip
    return r["prefill_latency"], r["median_decode_latency"]


class _StepClock(LogitsProcessor):
    """Called by ``generate`` once per new token, right after that step's forward: a timestamp per step (on CUDA,
    once the step's kernels are done)."""

    def __init__(self, device: torch.device = CPU):
        self.device, self.stamps = device, []

    def __call__(self, input_ids, scores):
        synchronize(self.device)
        self.stamps.append(time.perf_counter())
        return scores


def run_hf(model, batch, input_len, output_len, vocab):
    """Prefill = start to the first step's logits; decode = median gap between later steps' logits."""
    ids = torch.randint(0, min(vocab, 10000), (batch, input_len), generator=torch.Generator().manual_seed(0))
    ids, clock = ids.to(model.device), _StepClock(model.device)
    synchronize(model.device)
    tic = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False, eos_token_id=None,
                       pad_token_id=0, logits_processor=LogitsProcessorList([clock]))  # fmt: skip
    steps = [b - a for a, b in zip(clock.stamps, clock.stamps[1:])]
    return clock.stamps[0] - tic, statistics.median(steps)


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
    parser.add_argument("--reps", type=int, default=3, help="repetitions per engine and workload, engines alternating")
    parser.add_argument(
        "--engines",
        nargs="+",
        default=list(ENGINES),
        choices=list(ENGINES),
        help="minisgl: eager; compiled: --enable-torch-compile; hf: HF transformers generate",
    )
    parser.add_argument("--output", default="bench/results.json", help="the JSON results (the table goes to stdout)")
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
    return 0


def main(args: argparse.Namespace, device: torch.device, scratch: str) -> None:
    workloads = args.workloads
    # The first minisgl runner would set this anyway, process-wide: set first, every engine and probe runs alike.
    keep_freed_cpu_memory()
    peaks, bandwidths = machine_peaks(device), [read_bandwidth(device)]
    models = model_dirs(args.models, scratch)
    rows = []
    for model_name in args.models:
        path, hf_loader = models[model_name]
        for dtype_name in args.dtypes:
            max_tokens = max(b * (i + o) for b, i, o in workloads) + 64
            server_args = ServerArgs(model_path=path, dtype=dtype_name, max_total_tokens=max_tokens, device=args.device)
            hf = hf_loader(DTYPES[dtype_name]).eval().to(device)
            vocab = hf.config.vocab_size
            runs, model_runner = {}, None
            for engine in args.engines:
                if engine == "hf":
                    runs[engine] = partial(run_hf, hf)
                    continue
                with contextlib.redirect_stdout(io.StringIO()):
                    runner, _ = load_model(replace(server_args, enable_torch_compile=engine == "compiled"), 0)
                runs[engine] = partial(run_minisgl, runner)
                if engine == "minisgl":  # compiled, the weights stay plain for Inductor to pack
                    model_runner = runner.torch_runner
            for b, i, o in workloads:
                for run in runs.values():
                    run(b, i, min(o, 4), vocab)  # warm-up (and compile), as the bench does
                samples, linears, row_bandwidths = {engine: [] for engine in runs}, [], []
                for _ in range(args.reps):  # alternate engines so drifting machine load hits all alike
                    for engine, run in runs.items():
                        row_bandwidths.append(read_bandwidth(device))  # the bandwidth this run is about to have
                        samples[engine].append(run(b, i, o, vocab))
                    if model_runner is not None:
                        linears.append(decode_linears_time(model_runner, b))
                row = {"model": model_name, "dtype": dtype_name, "batch": b, "input": i, "output": o}
                for engine, values in samples.items():
                    row[f"{engine}_prefill_s"] = summarize([v[0] for v in values])
                    row[f"{engine}_decode_s"] = summarize([v[1] for v in values])
                if linears:
                    row["decode_linears_s"] = summarize(linears)
                row["prefill_flops"], row["decode_bytes"] = exact_prefill_flops(hf, b, i), decode_bytes(hf)
                row["read_bandwidth_bytes"] = statistics.median(row_bandwidths)
                row["read_bandwidth_samples"] = row_bandwidths
                bandwidths += row_bandwidths
                add_speedups(row)
                rows.append(row)
                speedups = ", ".join(f"{key} x{value:.2f}" for key, value in row.items() if key.endswith("speedup"))
                print(f"{model_name} {dtype_name} {b},{i},{o}: {speedups} (HF time / ours)", flush=True)
            runs = run = runner = hf = model_runner = None  # every engine's weights go before the next load
            if device.type == "cuda":
                torch.cuda.empty_cache()
    # A shared machine's matmul peaks drift: keep the better of the measurements before and after the engines ran.
    after = machine_peaks(device)
    peaks = {key: max(value, after[key]) for key, value in peaks.items()}
    bandwidths.append(read_bandwidth(device))
    peaks["read_bandwidth_bytes"], peaks["read_bandwidth_samples"] = statistics.median(bandwidths), bandwidths
    for row in rows:
        add_roofline_shares(row, peaks)
    print_table(rows, peaks)
    results = {"machine": machine_info(device), "device": device.type, "peaks": peaks, "rows": rows}
    write_whole(args.output, lambda f: json.dump(results, f, indent=1))
    print(f"written {args.output}")


def add_speedups(row: dict) -> None:
    """HF time / minisgl time: ``prefill_speedup`` and ``decode_speedup`` (eager), ``compiled_*_speedup``."""
    for engine, prefix in (("minisgl", ""), ("compiled", "compiled_")):
        if f"{engine}_prefill_s" in row and "hf_prefill_s" in row:
            for phase in ("prefill", "decode"):
                row[f"{prefix}{phase}_speedup"] = row[f"hf_{phase}_s"]["median"] / row[f"{engine}_{phase}_s"]["median"]


def add_roofline_shares(row: dict, peaks: dict) -> None:
    """Prefill as a share of the matmul peak; decode as the bandwidth floor's share of the step time, the floor
    at the row's own bandwidth (the median of the samples taken right before each of its runs)."""
    floor = row["decode_bytes"] / row["read_bandwidth_bytes"]
    for engine in (e for e in ENGINES if f"{e}_prefill_s" in row):
        prefill_rate = row["prefill_flops"] / row[f"{engine}_prefill_s"]["median"]
        row[f"{engine}_prefill_peak_share"] = prefill_rate / peaks[f"matmul_{row['dtype']}_flops"]
        row[f"{engine}_decode_floor_share"] = floor / row[f"{engine}_decode_s"]["median"]
    if "decode_linears_s" in row:
        seconds = row["decode_linears_s"]["median"]
        row["decode_linears_read_rate"] = row["decode_bytes"] / seconds
        # each weight element is read once and used in one multiply-add per row of the batch
        weights = row["decode_bytes"] / DTYPES[row["dtype"]].itemsize
        row["decode_linears_flop_rate"] = 2 * row["batch"] * weights / seconds


def print_table(rows, peaks) -> None:
    table = Table(title=(f"matmul peak fp32 {peaks['matmul_float32_flops'] / 1e9:.0f} GFLOP/s, "
                         f"bf16 {peaks['matmul_bfloat16_flops'] / 1e9:.0f} GFLOP/s; "
                         f"read bandwidth {peaks['read_bandwidth_bytes'] / 1e9:.1f} GB/s (median; each row's floor uses "
                         "its own samples)"))  # fmt: skip
    engines = [e for e in ENGINES if rows and f"{e}_prefill_s" in rows[0]]
    speedups = [key for key in ("prefill_speedup", "compiled_prefill_speedup", "decode_speedup",
                                "compiled_decode_speedup") if rows and key in rows[0]]  # fmt: skip
    columns = ["model", "dtype", "B,I,O"]
    for phase, share in (("prefill", "% peak"), ("decode", "% floor")):
        columns += [f"{phase} ms {ENGINES[e]}" + (" [min-max]" if e != "hf" else "") for e in engines]
        columns += [f"{share} {ENGINES[e]}" for e in engines]
    linears = bool(rows) and "decode_linears_s" in rows[0]
    columns += ["decode linears ms (GB/s)"] * linears
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
        cells += [f"{r[key]:.2f}" for key in speedups]
        table.add_row(*cells)
    Console(width=300).print(table)


if __name__ == "__main__":
    sys.exit(cli())
