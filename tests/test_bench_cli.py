"""End to end: ``python -m minisgl.bench_one_batch`` and ``python -m minisgl.bench_plot`` as subprocesses.

The printed lines must parse with SGLang's own regexes and match SGLang 0.5.14's f-strings, the JSON records
must carry SGLang's keys in SGLang's order, and bad input must give one ``error:`` line, exit code 2 and
leave the result file untouched.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minisgl import bench_plot
from minisgl.bench_args import BenchArgs

REPO = Path(__file__).resolve().parents[1]
SENTINEL = '{"run_name": "earlier", "note": "sentinel line written before the bench"}\n'
SMALL = ("--max-total-tokens", "4000", "--batch-size", "1", "2", "--input-len", "16", "32", "--output-len", "8")

# SGLang 0.5.14, sglang/test/test_utils.py, run_bench_one_batch(): how SGLang's CI reads this bench's stdout.
SGL_SECTION = r"Benchmark[\s\S]*Total"
SGL_PATTERN = r".*?latency: (?P<latency>\d+\.\d+).*?throughput:\s*(?P<throughput>\d+\.\d+)"

# SGLang 0.5.14, sglang/bench_one_batch.py, latency_test_run_once(): the record keys, in insertion order.
SGL_KEYS = ["run_name", "batch_size", "input_len", "output_len", "prefill_latency", "prefill_throughput",
            "median_decode_latency", "median_decode_throughput", "total_latency", "overall_throughput"]  # fmt: skip

# The same function's f-strings; each parsed line is re-formatted with them and must come back identical.
NUM = r"\s*(\d+\.\d+)"
LINE_FORMATS = {
    "prefill": (rf"Prefill\. latency:{NUM} s, throughput:{NUM} token/s",
                lambda m: f"Prefill. latency: {m[0]:6.5f} s, throughput: {m[1]:9.2f} token/s"),
    "decode": (rf"Decode (\d+)\. Batch size: (\d+), latency:{NUM} s, throughput:{NUM} token/s",
               lambda m: f"Decode {m[0]:d}. Batch size: {m[1]:d}, latency: {m[2]:6.5f} s, "
                         f"throughput: {m[3]:9.2f} token/s"),
    "median": (rf"Decode\.  median latency:{NUM} s, median throughput:{NUM} token/s",
               lambda m: f"Decode.  median latency: {m[0]:6.5f} s, median throughput: {m[1]:9.2f} token/s"),
    "total": (rf"Total\. latency:{NUM} s, throughput:{NUM} token/s",
              lambda m: f"Total. latency: {m[0]:6.3f} s, throughput: {m[1]:9.2f} token/s"),
}  # fmt: skip


def run(module: str, cwd: Path, *args, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), full_env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", module, *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=300)


def bench(cwd: Path, model: Path, *args, env: dict | None = None, ok: bool = True) -> subprocess.CompletedProcess:
    proc = run("minisgl.bench_one_batch", cwd, "--model-path", model, *args, env=env)
    if ok:
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
    return proc


def parse_line(line: str) -> tuple[str, list] | None:
    for kind, (pattern, fmt) in LINE_FORMATS.items():
        m = re.fullmatch(pattern, line)
        if m:
            values = [int(g) if g.isdigit() else float(g) for g in m.groups()]
            assert fmt(values) == line, f"{kind} line differs from SGLang's format: {line!r}"
            return kind, values
    return None


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_one_line_error(proc_or_code, stderr: str | None = None) -> str:
    code = proc_or_code if isinstance(proc_or_code, int) else proc_or_code.returncode
    stderr = stderr if stderr is not None else proc_or_code.stderr
    assert code == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) > len("error: "), stderr
    return lines[0]


@pytest.fixture(scope="module")
def sweep(tiny_llama, tmp_path_factory):
    """One latency sweep (2 batch sizes x 2 input lengths) into a result file that already had a line."""
    cwd = tmp_path_factory.mktemp("sweep")
    (cwd / "result.jsonl").write_text(SENTINEL)
    proc = bench(cwd, tiny_llama, *SMALL, "--run-name", "fp32")
    return proc.stdout, cwd / "result.jsonl"


def test_stdout_parses_with_sglang_regexes(sweep):
    stdout, result = sweep
    records = read_records(result)[1:]
    match = re.search(SGL_SECTION, stdout)
    assert match, stdout
    bench_output = match[0]
    prefill = re.search(r"Prefill." + SGL_PATTERN, bench_output)
    decode = re.search(r"Decode." + SGL_PATTERN, bench_output)
    assert prefill and decode
    assert float(prefill.group("latency")) == float(f"{records[0]['prefill_latency']:6.5f}")
    assert float(decode.group("latency")) > 0 and float(decode.group("throughput")) > 0
    assert "Warmup ..." in stdout.split("Benchmark ...")[0]  # the warmup's lines come before the section


def test_stdout_lines_follow_sglang_formats(sweep):
    stdout, result = sweep
    records = read_records(result)[1:]
    lines = stdout.split("Benchmark ...\n", 1)[1].splitlines()
    parsed = [p for p in map(parse_line, lines) if p is not None]
    blocks = []  # one per combination: prefill, decode 0..4 (7 steps, the first 5 printed), median, total
    for kind, values in parsed:
        if kind == "prefill":
            blocks.append([])
        blocks[-1].append((kind, values))
    assert len(blocks) == len(records) == 4
    for block, r in zip(blocks, records):
        kinds = [k for k, _ in block]
        assert kinds == ["prefill"] + ["decode"] * 5 + ["median", "total"]
        assert [v[0] for k, v in block if k == "decode"] == [0, 1, 2, 3, 4]
        assert all(v[1] == r["batch_size"] for k, v in block if k == "decode")
        assert f"{block[0][1][0]:6.5f}" == f"{r['prefill_latency']:6.5f}"
        assert f"{block[-2][1][0]:6.5f}" == f"{r['median_decode_latency']:6.5f}"
        assert f"{block[-1][1][0]:6.3f}" == f"{r['total_latency']:6.3f}"
    # Not a terminal: plain lines and an ASCII summary table, no colour codes.
    assert "\x1b[" not in stdout
    assert re.search(r"^\+-+\+$", stdout, re.M) and re.search(r"^\|\s+fp32 \|", stdout, re.M)


def test_records_have_sglang_keys_and_consistent_numbers(sweep):
    _, result = sweep
    text = result.read_text()
    assert text.startswith(SENTINEL)
    records = read_records(result)[1:]
    assert [(r["batch_size"], r["input_len"], r["output_len"]) for r in records] == [
        (1, 16, 8), (1, 32, 8), (2, 16, 8), (2, 32, 8)
    ]  # fmt: skip
    for r in records:
        assert list(r) == SGL_KEYS
        assert r["run_name"] == "fp32"
        bs, il, ol = r["batch_size"], r["input_len"], r["output_len"]
        assert math.isclose(r["prefill_throughput"], il * bs / r["prefill_latency"], rel_tol=1e-9)
        assert math.isclose(r["median_decode_throughput"], bs / r["median_decode_latency"], rel_tol=1e-9)
        assert math.isclose(r["overall_throughput"], (il + ol) * bs / r["total_latency"], rel_tol=1e-9)
        assert r["total_latency"] >= r["prefill_latency"] > 0


def test_output_len_one_has_no_decode(tiny_llama, tmp_path):
    # --input / --output: the abbreviations SGLang's run_bench_one_batch passes (argparse prefix matching)
    proc = bench(
        tmp_path, tiny_llama, "--max-total-tokens", "4000", "--batch-size", "2", "--input", "16", "--output", "1"
    )
    (record,) = read_records(tmp_path / "result.jsonl")
    assert list(record) == [k for k in SGL_KEYS if "median" not in k]
    assert math.isclose(record["overall_throughput"], 17 * 2 / record["total_latency"], rel_tol=1e-9)
    assert record["total_latency"] == record["prefill_latency"]
    benchmark = proc.stdout.split("Benchmark ...", 1)[1]
    assert "Decode" not in benchmark and "Total. latency:" in benchmark
    assert "nan" not in benchmark  # the summary shows "-" for the missing decode columns


def test_compiled_sweep_warms_up_every_batch_size(tiny_llama, tmp_path):
    """SGLang captures its graphs for every batch size before measuring; compiled, minisgl warms each size up
    (batch 1 specializes the extend graph, batch 5 needs the general decode graph), eagerly only the first."""
    sizes = ("--batch-size", "1", "5", "--input-len", "8", "--output-len", "3")
    for flags, warmups in [(("--enable-torch-compile",), 2), ((), 1)]:
        proc = bench(tmp_path, tiny_llama, "--max-total-tokens", "4000", *sizes, *flags)
        warmup, benchmark = proc.stdout.split("Benchmark ...", 1)
        assert warmup.count("Prefill. latency") == warmups, proc.stdout
        assert benchmark.count("Prefill. latency") == 2


def test_combination_over_the_pool_is_skipped(tiny_llama, tmp_path):
    args = ("--max-total-tokens", "100", "--batch-size", "1", "8", "--input-len", "16", "--output-len", "8")
    proc = bench(tmp_path, tiny_llama, *args)
    assert "skipping (8, 16, 8) due to max batch size limit" in proc.stdout.splitlines()
    assert [r["batch_size"] for r in read_records(tmp_path / "result.jsonl")] == [1]


def load_trace(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    assert "traceEvents" in trace and trace["traceEvents"]
    return trace


def test_profile_writes_prefill_and_decode_traces(tiny_llama, tmp_path):
    prof = tmp_path / "prof"
    prof.mkdir()
    args = ("--max-total-tokens", "4000", "--profile", "--batch-size", "1", "--input-len", "16", "--output-len", "8")
    proc = bench(tmp_path, tiny_llama, *args, env={"MINISGL_TORCH_PROFILER_DIR": str(prof)})
    names = {stage: f"profile_batch1_input16_output8_{stage}.trace.json.gz" for stage in ("prefill", "decode")}
    assert sorted(os.listdir(prof)) == sorted(names.values())  # no temporary file left behind
    for stage, name in names.items():
        load_trace(prof / name)
        assert f"torch profiler chrome trace for {stage} saved to {prof / name}" in proc.stdout.splitlines()
    assert len(read_records(tmp_path / "result.jsonl")) == 1


def test_profile_stage_decode_with_prefix(tiny_llama, tmp_path):
    args = ("--max-total-tokens", "4000", "--profile", "--profile-stage", "decode", "--profile-filename-prefix",
            "foo", "--batch-size", "1", "--input-len", "16", "--output-len", "8")  # fmt: skip
    proc = bench(tmp_path, tiny_llama, *args, env={"MINISGL_TORCH_PROFILER_DIR": str(tmp_path)})
    traces = sorted(p.name for p in tmp_path.glob("*.gz"))
    assert traces == ["foo_batch1_input16_output8_decode.trace.json.gz"]
    load_trace(tmp_path / traces[0])
    assert "trace for prefill" not in proc.stdout


def test_compiled_profile_names_inductor_kernels(tiny_llama, tmp_path):
    """Compiled, the decode trace shows Inductor's kernels one by one (the fused norms, attention and the rest),
    not only the graph's single call; an eager trace has none of them."""
    args = ("--max-total-tokens", "4000", "--profile", "--profile-stage", "decode", "--batch-size", "1",
            "--input-len", "16", "--output-len", "8")  # fmt: skip
    for flags, expect_kernels in [(("--enable-torch-compile",), True), ((), False)]:
        out = tmp_path / ("compiled" if flags else "eager")
        out.mkdir()
        bench(tmp_path, tiny_llama, *args, *flags, env={"MINISGL_TORCH_PROFILER_DIR": str(out)})
        (trace,) = out.glob("*_decode.trace.json.gz")
        names = {event.get("name", "") for event in load_trace(trace)["traceEvents"]}
        assert any("cpp_fused" in name for name in names) == expect_kernels, sorted(names)[:40]


def test_prompt_file_in_latency_mode(tiny_llama, tmp_path):
    (tmp_path / "prompts.txt").write_text("The capital of France is\nToday is a sunny day and I like\n")
    args = ("--max-total-tokens", "4000", "--batch-size", "1", "3", "--input-len", "16", "--output-len", "4")
    bench(tmp_path, tiny_llama, *args, "--prompt-filename", "prompts.txt")
    records = read_records(tmp_path / "result.jsonl")
    assert [r["batch_size"] for r in records] == [1, 3] and all(list(r) == SGL_KEYS for r in records)


def test_chart_of_two_runs(tiny_llama, tmp_path):
    sweep_args = (
        "--max-total-tokens",
        "4000",
        "--batch-size",
        "1",
        "2",
        "--input-len",
        "16",
        "32",
        "--output-len",
        "4",
    )
    bench(tmp_path, tiny_llama, *sweep_args, "--run-name", "a")
    bench(tmp_path, tiny_llama, *sweep_args, "--run-name", "b", "--dtype", "bfloat16")
    bench(
        tmp_path, tiny_llama, "--correctness-test", "--max-total-tokens", "4000", "--output-len", "4", "--run-name", "a"
    )
    assert len(read_records(tmp_path / "result.jsonl")) == 8 + 3
    proc = run("minisgl.bench_plot", tmp_path, "result.jsonl", "-o", "chart.png")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    png = (tmp_path / "chart.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and 20_000 < len(png) < 5_000_000
    assert "chart of 8 records saved to chart.png" in proc.stdout
    os.umask(umask := os.umask(0))
    assert not list(tmp_path.glob(".*")) and (tmp_path / "chart.png").stat().st_mode & 0o777 == 0o666 & ~umask
    proc = run("minisgl.bench_plot", tmp_path, "result.jsonl", "-o", "other.png", "--run-name", "c")
    assert "'c'" in assert_one_line_error(proc) and not (tmp_path / "other.png").exists()


LATENCY = {"run_name": "x", "batch_size": 1, "input_len": 16, "output_len": 1, "prefill_latency": 0.01,
           "prefill_throughput": 1600.0, "total_latency": 0.01, "overall_throughput": 1700.0}  # fmt: skip
CORRECTNESS = {"run_name": "x", "prompt": "p", "input_ids": [1], "output_ids": [2], "output_text": "a"}


def test_chart_without_decode_records(tmp_path, capsys):
    (tmp_path / "r.jsonl").write_text(json.dumps(LATENCY) + "\n" + json.dumps({**LATENCY, "batch_size": 4}) + "\n")
    assert bench_plot.main([str(tmp_path / "r.jsonl"), "-o", str(tmp_path / "c.svg")]) == 0
    assert (tmp_path / "c.svg").read_text().lstrip().startswith("<?xml")


@pytest.mark.parametrize(
    "content, args",
    [
        (None, ["missing.jsonl", "-o", "c.png"]),
        (json.dumps(CORRECTNESS), ["r.jsonl", "-o", "c.png"]),
        ("", ["r.jsonl", "-o", "c.png"]),
        ("not json", ["r.jsonl", "-o", "c.png"]),
        (json.dumps({**LATENCY, "batch_size": "1"}), ["r.jsonl", "-o", "c.png"]),
        (json.dumps(LATENCY), ["r.jsonl", "-o", "c.png", "--run-name", "y"]),
        (json.dumps(LATENCY), ["r.jsonl", "-o", "no-dir/c.png"]),
        (json.dumps(LATENCY), ["r.jsonl", "-o", "c.xyz"]),
        (json.dumps(LATENCY), ["r.jsonl", "-o", "."]),
        (json.dumps(LATENCY), ["r.jsonl"]),
        (json.dumps(LATENCY), ["r.jsonl", "-o", "c.png", "--bar"]),
    ],
    ids=[
        "missing",
        "correctness-only",
        "empty",
        "not-json",
        "non-numeric",
        "unknown-run",
        "no-dir",
        "format",
        "directory",
        "no-output",
        "unknown-flag",
    ],  # fmt: skip
)
def test_chart_bad_input(tmp_path, capsys, monkeypatch, content, args):
    monkeypatch.chdir(tmp_path)
    if content is not None:
        Path("r.jsonl").write_text(content + "\n")
    before = sorted(os.listdir(tmp_path))
    try:
        code = bench_plot.main(args)
    except SystemExit as e:  # argparse errors
        code = e.code
    assert_one_line_error(code, capsys.readouterr().err)
    assert sorted(os.listdir(tmp_path)) == before


BAD_INPUTS = {
    "batch-size-0": (["--batch-size", "0"], {}, "--batch-size"),
    "input-len-negative": (["--input-len", "-1"], {}, "--input-len"),
    "output-len-0": (["--output-len", "0"], {}, "--output-len"),
    "over-context": (["--input-len", "600", "--output-len", "8"], {}, "context length 512"),
    "result-dir-missing": (["--result-filename", "/nonexistent-dir/r.jsonl"], {}, "--result-filename"),
    "profile-dir-missing": (["--profile"], {"MINISGL_TORCH_PROFILER_DIR": "/nonexistent"}, "/nonexistent"),
    "profile-steps-0": (["--profile", "--profile-steps", "0"], {}, "--profile-steps"),
    "dtype-unknown": (["--dtype", "float8"], {}, "float8"),
    "sglang-only-flag": (["--kv-cache-dtype", "fp8"], {}, "--kv-cache-dtype"),
    "model-missing": (["--model-path", "/nonexistent"], {}, "/nonexistent"),
    "page-size": (["--page-size", "16"], {}, "--page-size"),
    "torch-compile-max-bs-0": (["--enable-torch-compile", "--torch-compile-max-bs", "0"], {}, "--torch-compile-max-bs"),
    "unknown-flag": (["--foo"], {}, "--foo"),
    "prompt-over-context": (["--prompt-filename", "long.txt"], {}, "context length 512"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input(tiny_llama, tmp_path, case):
    args, env, fragment = BAD_INPUTS[case]
    (tmp_path / "result.jsonl").write_text(SENTINEL)
    (tmp_path / "long.txt").write_text(" ".join(["The capital of France is Paris."] * 100) + "\n")
    env = {"MINISGL_TORCH_PROFILER_DIR": str(tmp_path), **env}  # a stray trace would show up below
    base = ("--max-total-tokens", "4000", "--batch-size", "1", "--input-len", "16", "--output-len", "2")
    proc = bench(tmp_path, tiny_llama, *base, *args, env=env, ok=False)
    assert fragment in assert_one_line_error(proc)
    assert (tmp_path / "result.jsonl").read_text() == SENTINEL
    assert sorted(p.name for p in tmp_path.iterdir()) == ["long.txt", "result.jsonl"]


def test_help_lists_every_bench_flag(tmp_path):
    proc = run("minisgl.bench_one_batch", tmp_path, "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: python -m minisgl.bench_one_batch")
    for field in dataclasses.fields(BenchArgs):
        assert f"--{field.name.replace('_', '-')}" in proc.stdout
    assert "--model-path" in proc.stdout and "--max-total-tokens" in proc.stdout
