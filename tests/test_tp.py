"""Tensor parallelism on CPU (gloo, two ranks): tp=2 against tp=1, the launcher's failure handling, the sizes check.

Each tp=2 run spawns two processes that import torch and transformers, so the runs are few and shared:
one probe per model returns the correctness mode's records, a full-prompt prefill's logits and every
rank's parameter bytes.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from minisgl import bench_one_batch
from minisgl.bench_args import BenchArgs
from minisgl.distributed.parallel_state import destroy_distributed_environment, init_distributed_environment
from minisgl.server_args import ServerArgs
from minisgl.tp_launcher import TPRankError, launch_tp
from minisgl.utils.common import InputError

REPO = Path(__file__).resolve().parents[1]
NOT_SHARDED = ("embed_tokens", "lm_head", "norm")  # vocab-split (ceil) or replicated; the rest splits exactly


def _probe(server_args: ServerArgs, bench_args: BenchArgs, tp_rank: int, dist_init_method: str | None):
    """One rank: a full-prompt prefill's logits and every rank's parameter bytes, then the bench's own
    ``work`` (the correctness mode: records written by rank 0, process group destroyed)."""
    try:
        runner, tokenizer = bench_one_batch.load_model(server_args, tp_rank, dist_init_method)
        no_cut = dataclasses.replace(bench_args, cut_len=0)
        _, _, reqs = bench_one_batch.prepare_inputs_for_correctness_test(no_cut, tokenizer, [])
        _, logits, batch = runner.extend(reqs)
        runner.cleanup(batch)
        params = runner.torch_runner.model.named_parameters()
        sharded = sum(p.numel() * p.element_size() for n, p in params if not any(k in n for k in NOT_SHARDED))
        nbytes = [(sharded, runner.torch_runner.weight_bytes)] * server_args.tp_size
        if server_args.tp_size > 1:
            dist.all_gather_object(nbytes, nbytes[0])
        records = bench_one_batch.work(server_args, bench_args, tp_rank, dist_init_method)
        return {"records": records, "logits": logits, "bytes": nbytes}
    finally:
        destroy_distributed_environment()


def _fail_work(server_args: ServerArgs, bench_args: BenchArgs, tp_rank: int, dist_init_method: str | None):
    """Rank 1 fails as ``bench_args.run_name`` says while rank 0 blocks; pids go to ``result_filename`` (a dir)."""
    mode, pid_dir = bench_args.run_name, Path(bench_args.result_filename)
    (pid_dir / f"rank{tp_rank}.pid").write_text(str(os.getpid()))
    while not (pid_dir / "rank0.pid").exists():  # fail only once rank 0 is really running
        time.sleep(0.05)
    if mode == "collective":  # rank 0 waits in an all-reduce that rank 1 never joins
        init_distributed_environment(tp_rank, server_args.tp_size, dist_init_method, torch.device("cpu"))
        try:
            if tp_rank == 0:
                dist.all_reduce(torch.ones(1))
            time.sleep(0.5)
            raise ValueError("bad shard on rank 1")
        finally:
            destroy_distributed_environment()
    if tp_rank == 0 or mode == "sleep":
        time.sleep(600)
    if mode == "input":
        raise InputError("checkpoint tensor does not fit; the weights do not match the model config")
    os.kill(os.getpid(), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # an unreaped zombie has exited
    except FileNotFoundError:
        return False


def _args(model_dir, tp: int, result: Path, **bench) -> tuple[ServerArgs, BenchArgs]:
    server_args = ServerArgs(model_path=str(model_dir), dtype="float32", tp_size=tp, max_total_tokens=2000)
    return server_args, BenchArgs(result_filename=str(result), **bench)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """``probe(model_dir)`` -> (tp=1 result, tp=2 result), each computed once per module."""
    cache = {}

    def run(model_dir):
        if model_dir not in cache:
            out = tmp_path_factory.mktemp("probe")
            bench = dict(correctness_test=True, output_len=(16,))
            ref = _probe(*_args(model_dir, 1, out / "tp1.jsonl", **bench), 0, None)
            server_args, bench_args = _args(model_dir, 2, out / "tp2.jsonl", **bench)
            cache[model_dir] = ref, launch_tp(_probe, server_args, bench_args), out
        return cache[model_dir]

    return run


MODELS = {
    "llama": dict(arch="llama"),  # 4 query heads, 2 KV heads: each rank gets one KV head
    "qwen3": dict(arch="qwen3", head_dim=24),  # q/k norm, head_dim != hidden / heads
    "llama-1kv": dict(arch="llama", num_key_value_heads=1),  # fewer KV heads than ranks: replicated
}


@pytest.fixture(params=list(MODELS))
def model_dir(request, make_model):
    return make_model(**MODELS[request.param])


def test_tp2_prefill_logits_match_tp1(probe, model_dir):
    ref, tp2, _ = probe(model_dir)
    assert ref["logits"].dtype == torch.float32 and ref["logits"].shape == tp2["logits"].shape
    assert (tp2["logits"] - ref["logits"]).abs().max().item() <= 1e-5


def test_tp2_greedy_tokens_match_tp1(probe, model_dir):
    ref, tp2, out = probe(model_dir)
    ref_ids = [r["output_ids"] for r in ref["records"]]
    assert [r["output_ids"] for r in tp2["records"]] == ref_ids and all(len(ids) == 16 for ids in ref_ids)
    written = [json.loads(line)["output_ids"] for line in (out / "tp2.jsonl").read_text().splitlines()]
    assert written == ref_ids  # only rank 0 wrote: one line per prompt


def test_tp2_compiled_matches_tp1(probe, make_model, tmp_path):
    """--enable-torch-compile with two ranks: the all-reduces sit inside the compiled graph."""
    model_dir = make_model(**MODELS["llama"])
    ref, _, _ = probe(model_dir)
    server_args, bench_args = _args(model_dir, 2, tmp_path / "c.jsonl", correctness_test=True, output_len=(16,))
    compiled = launch_tp(_probe, dataclasses.replace(server_args, enable_torch_compile=True), bench_args)
    assert (compiled["logits"] - ref["logits"]).abs().max().item() <= 1e-5
    assert [r["output_ids"] for r in compiled["records"]] == [r["output_ids"] for r in ref["records"]]


def test_each_rank_holds_half_the_parameters(probe, make_model):
    ref, tp2, _ = probe(make_model(**MODELS["llama"]))
    (ref_sharded, ref_total), *_ = ref["bytes"]
    assert len(tp2["bytes"]) == 2
    for sharded, total in tp2["bytes"]:
        assert abs(sharded / ref_sharded - 0.5) < 0.01
        assert 0.5 <= total / ref_total < 0.55  # the replicated norms are tiny


def test_kv_heads_are_replicated_when_fewer_than_ranks(probe, make_model):
    ref, tp2, _ = probe(make_model(**MODELS["llama-1kv"]))
    kv = 2 * 2 * 16 * 64 * 4  # layers x (k, v) x head_dim x hidden x float32: the one KV head, whole on each rank
    (ref_sharded, _), *_ = ref["bytes"]
    assert [sharded for sharded, _ in tp2["bytes"]] == [(ref_sharded - kv) // 2 + kv] * 2


def test_latency_mode_tp2_cli(make_model, tmp_path):
    result = tmp_path / "latency.jsonl"
    cmd = [sys.executable, "-m", "minisgl.bench_one_batch", "--model-path", str(make_model(**MODELS["qwen3"])),
           "--tp-size", "2", "--max-total-tokens", "2000", "--batch-size", "1", "4", "--input-len", "32",
           "--output-len", "16", "--run-name", "tp2", "--result-filename", str(result)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("Prefill. latency") == 3  # warmup + two batch sizes, printed by rank 0 only
    records = [json.loads(line) for line in result.read_text().splitlines()]
    assert [(r["run_name"], r["batch_size"], r["input_len"], r["output_len"]) for r in records] == [
        ("tp2", 1, 32, 16),
        ("tp2", 4, 32, 16),
    ]
    assert all(r["prefill_latency"] > 0 and r["median_decode_latency"] > 0 for r in records)


@pytest.mark.parametrize(
    "mode, error, message",
    [
        ("input", InputError, "tp rank 1 failed: checkpoint tensor does not fit; the weights do not match"),
        ("collective", TPRankError, "tp rank 1 failed: ValueError: bad shard on rank 1 (test_tp.py:"),
        ("killed", TPRankError, "tp rank 1 failed: killed by signal SIGKILL without reporting"),
    ],
)
def test_failing_rank_takes_the_group_down(mode, error, message, tmp_path, capfd):
    server_args = ServerArgs(tp_size=2)
    tic = time.monotonic()
    with pytest.raises(error) as info:
        launch_tp(_fail_work, server_args, BenchArgs(run_name=mode, result_filename=str(tmp_path)))
    assert time.monotonic() - tic < 30
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
    pids = [int(p.read_text()) for p in sorted(tmp_path.glob("rank*.pid"))]
    assert len(pids) == 2 and not any(_alive(pid) for pid in pids)
    assert multiprocessing.active_children() == []
    assert "Traceback" not in capfd.readouterr().err  # the error is shown once, by the caller


def test_ranks_exit_when_the_launcher_is_killed(tmp_path):
    script = (
        "from minisgl.bench_args import BenchArgs; from minisgl.server_args import ServerArgs\n"
        "from minisgl.tp_launcher import launch_tp; from tests.test_tp import _fail_work\n"
        f"launch_tp(_fail_work, ServerArgs(tp_size=2), BenchArgs(run_name='sleep', result_filename={str(tmp_path)!r}))"
    )
    launcher = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("rank*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
        assert len(pids) == 2
    finally:
        launcher.kill()
        launcher.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in pids)


def test_tp_size_must_divide_heads(make_model, tmp_path):
    cmd = [sys.executable, "-m", "minisgl.bench_one_batch", "--model-path", str(make_model(**MODELS["llama"])),
           "--tp-size", "3", "--max-total-tokens", "1000", "--correctness-test",
           "--result-filename", str(tmp_path / "r.jsonl")]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: --tp-size 3 must divide the attention heads (4) and intermediate size (128)"
    ]
    assert proc.stdout == "" and not (tmp_path / "r.jsonl").exists()


def test_cli_reports_a_rank_failure_in_one_line(monkeypatch, capsys, tiny_llama):
    def fail(server_args, bench_args):
        raise TPRankError("tp rank 1 failed: RuntimeError: boom (linear.py:40)")

    monkeypatch.setattr(bench_one_batch, "main", fail)
    assert bench_one_batch.cli(["--model-path", str(tiny_llama), "--tp-size", "2"]) == 1
    assert capsys.readouterr().err == "error: tp rank 1 failed: RuntimeError: boom (linear.py:40)\n"
