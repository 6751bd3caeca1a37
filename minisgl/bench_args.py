"""BenchArgs: the bench's own flags (SGLang keeps this dataclass inside ``bench_one_batch.py``), and the
checks that refuse bad input before any weight is loaded."""

from __future__ import annotations

import argparse
import dataclasses
import os

from transformers import PretrainedConfig

from minisgl.server_args import ServerArgs
from minisgl.utils.common import InputError
from minisgl.utils.profile_utils import get_torch_profiler_output_dir


@dataclasses.dataclass
class BenchArgs:
    run_name: str = "default"
    batch_size: tuple[int, ...] = (1,)
    input_len: tuple[int, ...] = (1024,)
    output_len: tuple[int, ...] = (16,)
    prompt_filename: str = ""
    result_filename: str = "result.jsonl"
    correctness_test: bool = False
    cut_len: int = 4
    log_decode_step: int = 0
    profile: bool = False
    profile_record_shapes: bool = False
    profile_activities: tuple[str, ...] = ("CPU", "GPU")
    profile_stage: str = "all"
    profile_filename_prefix: str = "profile"
    profile_start_step: int | None = None
    profile_steps: int | None = None

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        add = parser.add_argument
        add("--run-name", type=str, default="default", help="label stored with each result record")
        add("--batch-size", type=int, nargs="+", default=(1,), help="batch sizes to sweep")
        add("--input-len", type=int, nargs="+", default=(1024,), help="prompt lengths to sweep")
        add("--output-len", type=int, nargs="+", default=(16,), help="generated lengths (prefill + len-1 decodes)")
        add("--prompt-filename", type=str, default="", help="file of prompts, one per line, instead of random ids")
        add("--result-filename", type=str, default="result.jsonl", help="JSON-lines file results are appended to")
        add("--correctness-test", action="store_true", help="run the correctness mode instead of the latency sweep")
        add("--cut-len", type=int, default=4, help="correctness: tokens in the first extend (the cached prefix)")
        add("--log-decode-step", type=int, default=0, help="also print every N-th decode step (0: first 5 only)")
        add("--profile", action="store_true", help="record torch.profiler traces")
        add("--profile-record-shapes", action="store_true", help="record tensor shapes in the traces")
        add(
            "--profile-activities",
            type=str,
            nargs="+",
            default=["CPU", "GPU"],
            choices=["CPU", "GPU"],
            help="profiler activities (GPU is dropped on a CPU device)",
        )
        add("--profile-stage", type=str, default="all", choices=["all", "prefill", "decode"], help="stages to trace")
        add(
            "--profile-filename-prefix",
            "--profile-prefix",
            dest="profile_filename_prefix",
            type=str,
            default="profile",
            help="trace names: PREFIX_batchB_inputI_outputO_{prefill|decode}.trace.json.gz",
        )
        add("--profile-start-step", type=int, default=None, help="first decode step traced (default output_len // 2)")
        add("--profile-steps", type=int, default=None, help="decode steps traced (default 1)")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> BenchArgs:
        values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)}
        for name in ("batch_size", "input_len", "output_len", "profile_activities"):
            values[name] = tuple(values[name])
        return cls(**values)


def _check_writable_file(path: str, flag: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    target = path if os.path.exists(path) else directory
    if not os.path.isdir(directory) or not os.access(target, os.W_OK):
        raise InputError(f"{flag} {path} cannot be written; choose a path in a writable directory")


def check_args(server_args: ServerArgs, bench_args: BenchArgs, hf_config: PretrainedConfig) -> None:
    """Refuse every bad value up front: one line, exit 2, nothing written."""
    server_args.check()
    for flag in ("batch_size", "input_len", "output_len"):
        bad = [v for v in getattr(bench_args, flag) if v < 1]
        if bad:
            raise InputError(f"--{flag.replace('_', '-')} must be positive, got {bad[0]}")
    context_len = hf_config.max_position_embeddings
    longest = max(bench_args.output_len) + (0 if bench_args.correctness_test else max(bench_args.input_len))
    if longest > context_len:
        raise InputError(f"input_len + output_len = {longest} exceeds the model's context length {context_len}; "
                         "use shorter lengths")  # fmt: skip
    if bench_args.cut_len < 0:
        raise InputError(f"--cut-len must be >= 0, got {bench_args.cut_len}")
    if bench_args.log_decode_step < 0:
        raise InputError(f"--log-decode-step must be >= 0, got {bench_args.log_decode_step}")
    if bench_args.profile_start_step is not None and bench_args.profile_start_step < 0:
        raise InputError(f"--profile-start-step must be >= 0, got {bench_args.profile_start_step}")
    if bench_args.profile_steps is not None and bench_args.profile_steps < 1:
        raise InputError(f"--profile-steps must be at least 1, got {bench_args.profile_steps}")
    if bench_args.prompt_filename and not os.path.isfile(bench_args.prompt_filename):
        raise InputError(f"--prompt-filename {bench_args.prompt_filename} does not exist")
    if bench_args.result_filename:
        _check_writable_file(bench_args.result_filename, "--result-filename")
    if bench_args.profile:
        out_dir = get_torch_profiler_output_dir()
        if not os.path.isdir(out_dir) or not os.access(out_dir, os.W_OK):
            raise InputError(f"profile directory {out_dir} is not writable; set MINISGL_TORCH_PROFILER_DIR")
    heads, inter, tp = hf_config.num_attention_heads, hf_config.intermediate_size, server_args.tp_size
    if heads % tp or inter % tp:
        raise InputError(f"--tp-size {tp} must divide the attention heads ({heads}) and intermediate size ({inter})")
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    if kv_heads % tp and tp % kv_heads:  # KV heads are split evenly, or each is replicated on tp/kv ranks
        raise InputError(f"--tp-size {tp} and the {kv_heads} KV heads must divide one another")
