"""Bad input to the runtime: one line that says what is wrong, exit code 2, no traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from minisgl.bench_one_batch import cli


def run_cli(capsys, *argv) -> tuple[int, str]:
    code = cli(list(argv))
    err = capsys.readouterr().err
    return code, err


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0]


def correctness(model, *extra):
    return ("--model-path", str(model), "--correctness-test", "--max-total-tokens", "500", "--output-len", "4", *extra)


def test_missing_model_path(capsys, tmp_path):
    code, err = run_cli(capsys, *correctness(tmp_path / "nope"))
    assert_one_line_error(code, err, "does not exist")


def test_unknown_architecture(capsys, tiny_llama, tmp_path):
    model = shutil.copytree(tiny_llama, tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (model / "config.json").write_text(json.dumps(config))
    code, err = run_cli(capsys, *correctness(model))
    assert_one_line_error(code, err, "GPT2LMHeadModel", "not supported")


def test_missing_weights_file(capsys, tiny_llama, tmp_path):
    model = shutil.copytree(tiny_llama, tmp_path / "m")
    (model / "model.safetensors").unlink()
    code, err = run_cli(capsys, *correctness(model))
    assert_one_line_error(code, err, "no .safetensors files")


def test_corrupt_weights_file(capsys, tiny_llama, tmp_path):
    model = shutil.copytree(tiny_llama, tmp_path / "m")
    (model / "model.safetensors").write_bytes(b"\x00" * 100)
    code, err = run_cli(capsys, *correctness(model))
    assert_one_line_error(code, err, "missing or corrupt")


def test_weights_that_do_not_fit_the_config(capsys, tiny_llama, tmp_path):
    model = shutil.copytree(tiny_llama, tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    config["intermediate_size"] = 96
    (model / "config.json").write_text(json.dumps(config))
    code, err = run_cli(capsys, *correctness(model))
    assert_one_line_error(code, err, "do not match the model config")


def test_prompt_not_longer_than_cut_len(capsys, tiny_llama, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a\n")
    code, err = run_cli(capsys, *correctness(tiny_llama, "--prompt-filename", str(prompts), "--cut-len", "4"))
    assert_one_line_error(code, err, "--cut-len")


def test_batch_bigger_than_pools(capsys, tiny_llama, tmp_path):
    result = tmp_path / "r.jsonl"
    code, err = run_cli(capsys, "--model-path", str(tiny_llama), "--correctness-test", "--max-total-tokens", "12",
                        "--result-filename", str(result))  # fmt: skip
    assert_one_line_error(code, err, "out of KV cache", "--max-total-tokens")
    assert not result.exists()


@pytest.mark.parametrize("flag", ["--kv-cache-dtype", "--cuda-graph-bs"])
def test_sglang_flags_minisgl_lacks_are_refused_by_name(flag):
    proc = subprocess.run([sys.executable, "-m", "minisgl.bench_one_batch", flag, "x"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {flag} is an SGLang flag that minisgl does not implement; "
                                                "remove it (see --help)"]  # fmt: skip


def test_correctness_mode_writes_one_record_per_prompt(capsys, tiny_llama, tmp_path):
    result = tmp_path / "r.jsonl"
    result.write_text('{"earlier": 1}\n')
    assert cli([*correctness(tiny_llama), "--result-filename", str(result), "--run-name", "t"]) == 0
    out = capsys.readouterr().out
    assert "prefill logits (first half):" in out and "prefill logits (final):" in out
    assert out.count("========== Prompt") == 3
    lines = result.read_text().splitlines()
    assert lines[0] == '{"earlier": 1}' and len(lines) == 4
    record = json.loads(lines[1])
    assert list(record) == ["run_name", "prompt", "input_ids", "output_ids", "output_text"]
    assert record["run_name"] == "t" and record["prompt"] == "The capital of France is"
    assert len(record["output_ids"]) == 4


def test_tp_size_must_divide_the_kv_heads_or_be_divided_by_them():
    """24 heads, 6 KV heads (intermediate 8208 = 2^4 * 3^3 * 19): tp 4 splits heads but not the KV heads."""
    from transformers import LlamaConfig

    from minisgl.bench_args import BenchArgs, check_args
    from minisgl.server_args import ServerArgs
    from minisgl.utils.common import InputError

    config = LlamaConfig(num_attention_heads=24, num_key_value_heads=6, intermediate_size=8208, hidden_size=1536)
    with pytest.raises(InputError, match="6 KV heads must divide one another"):
        check_args(ServerArgs(tp_size=4), BenchArgs(result_filename=""), config)
    check_args(ServerArgs(tp_size=3), BenchArgs(result_filename=""), config)  # 2 KV heads per rank
    check_args(ServerArgs(tp_size=12), BenchArgs(result_filename="", batch_size=(1,)), config)  # replicated


def test_batches_beyond_the_request_rows_are_skipped(capsys, tiny_llama, tmp_path):
    """More requests than req_to_token rows: SGLang's skip message, not an error mid-sweep."""
    from minisgl.model_executor import model_runner

    code = cli(["--model-path", str(tiny_llama), "--max-total-tokens", "100000", "--batch-size", "2", "1025",
                "--input-len", "4", "--output-len", "2", "--result-filename", str(tmp_path / "r.jsonl")])  # fmt: skip
    out = capsys.readouterr().out
    assert model_runner._MAX_NUM_REQS == 1024
    assert code == 0 and "skipping (1025, 4, 2) due to max batch size limit" in out


@pytest.mark.parametrize(
    "device, message",
    [("cuda:abc", "--device cuda:abc is not a device; use cuda or cuda:N"),
     ("cudax", "--device cudax is not a device; use cuda or cuda:N"),
     ("cuda:1", "--device cuda:1: this machine has 1 CUDA device(s)"),
     ("tpu", "--device tpu is not supported; use cpu or cuda")],
)  # fmt: skip
def test_resolve_device_refuses_what_is_not_there(monkeypatch, device, message):
    """As on a one-GPU machine: a malformed or absent device index is a one-line InputError, not torch's error."""
    from minisgl.utils.common import InputError, resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(InputError) as error:
        resolve_device(device)
    assert str(error.value) == message
    assert resolve_device("cuda:0") == torch.device("cuda", 0) and resolve_device("cuda") == torch.device("cuda")
