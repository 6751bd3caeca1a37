"""Benchmark the latency of running a single static batch without a server (SGLang's microscope entry).

The whole serving spine in one file: prepare inputs -> ``Req`` / ``ScheduleBatch`` -> ``ForwardBatch``
-> ``ModelRunner.forward`` -> ``sample`` -> latency, profile or correctness output. Same flags, steps and
printed lines as SGLang 0.5.14's ``sglang/bench_one_batch.py``:

    # correctness: prefix extend, then the rest of each prompt on the cached prefix, then decode
    python -m minisgl.bench_one_batch --correctness-test
    # latency sweep (results appended to result.jsonl)
    python -m minisgl.bench_one_batch --batch-size 1 8 --input-len 128 512 --output-len 32 --run-name fp32
    # torch profiler traces for one combination ($MINISGL_TORCH_PROFILER_DIR, default the temp dir); compiled,
    # Inductor's kernels are profiled one by one
    python -m minisgl.bench_one_batch --batch-size 1 --input-len 256 --profile

What SGLang's file does more: Apple MLX and CUDA-profiler (nsys) paths, DP-attention MLP sync,
multi-node rank placement, and the scheduler's whole world it deliberately leaves out.
"""

from __future__ import annotations

import itertools
import sys
import time

import numpy as np
import torch

from minisgl import bench_utils
from minisgl.bench_args import BenchArgs, check_args
from minisgl.configs.model_config import ModelConfig, resolve_dtype
from minisgl.distributed.parallel_state import destroy_distributed_environment
from minisgl.managers.schedule_batch import Req, ScheduleBatch
from minisgl.model_executor.cpu_graph_runner import profile_compiled_kernels
from minisgl.model_executor.forward_batch_info import ForwardBatch
from minisgl.model_executor.model_runner import ModelRunner
from minisgl.model_loader.default_model import default_model_path
from minisgl.sampling.sampling_params import SamplingParams
from minisgl.server_args import ServerArgs
from minisgl.tp_launcher import TPRankError, launch_tp
from minisgl.utils.common import InputError, resolve_device, synchronize
from minisgl.utils.hf_transformers_utils import get_config, get_tokenizer
from minisgl.utils.profile_utils import create_torch_profiler_filename, start_profile, stop_profile

DEFAULT_PROMPTS = ["The capital of France is", "The capital of the United Kindom is", "Today is a sunny day and I like"]


class _TorchBenchRunner:
    """The six operations the bench needs from a ``ModelRunner``."""

    def __init__(self, model_runner: ModelRunner):
        self.torch_runner = model_runner

    def clear(self) -> None:
        self.torch_runner.req_to_token_pool.clear()
        self.torch_runner.token_to_kv_pool_allocator.clear()

    def extend(self, reqs: list[Req]):
        return extend(reqs, self.torch_runner)

    def decode(self, input_token_ids: torch.Tensor, batch: ScheduleBatch):
        return decode(input_token_ids, batch, self.torch_runner)

    def cleanup(self, batch: ScheduleBatch) -> None:
        self.clear()

    def synchronize(self) -> None:
        synchronize(self.torch_runner.device)

    def max_batch_size(self, input_len: int, output_len: int) -> int:
        by_tokens = self.torch_runner.max_total_num_tokens // (input_len + output_len)
        return min(by_tokens, self.torch_runner.req_to_token_pool.size)


def load_model(server_args: ServerArgs, tp_rank: int, dist_init_method: str | None = None):
    rank_print = print if tp_rank == 0 else lambda *args, **kwargs: None
    device = resolve_device(server_args.device)
    if device.type == "cuda" and server_args.tp_size > 1:
        device = torch.device("cuda", tp_rank)
    hf_config = get_config(server_args.model_path)
    model_config = ModelConfig.from_hf_config(hf_config, resolve_dtype(server_args.dtype, hf_config, device))
    model_runner = ModelRunner(model_config, server_args, device, tp_rank, dist_init_method)
    rank_print(f"max_total_num_tokens={model_runner.max_total_num_tokens}")
    if server_args.enable_torch_compile:
        rank_print("torch.compile is on: the first extend and the first decode compile (about two minutes on 2 cores)")
    tokenizer = get_tokenizer(server_args.tokenizer_path or server_args.model_path)
    return _TorchBenchRunner(model_runner), tokenizer


def _make_req(rid: int, text: str, input_ids: list[int], output_len: int) -> Req:
    req = Req(rid, text, input_ids, SamplingParams(temperature=0, max_new_tokens=output_len))
    req.full_untruncated_fill_ids = req.origin_input_ids
    req.fill_len = len(req.full_untruncated_fill_ids)
    req.set_extend_input_len(req.fill_len - len(req.prefix_indices))
    return req


def prepare_inputs_for_correctness_test(bench_args: BenchArgs, tokenizer, custom_prompts: list[str]):
    prompts = custom_prompts[: bench_args.batch_size[0]] if custom_prompts else DEFAULT_PROMPTS
    input_ids = [tokenizer.encode(p) for p in prompts]
    reqs = []
    for i, ids in enumerate(input_ids):
        if len(ids) <= bench_args.cut_len:
            raise InputError(f"prompt {i} has {len(ids)} tokens, not more than --cut-len {bench_args.cut_len}; "
                             "lower --cut-len or use a longer prompt")  # fmt: skip
        cut = ids[: bench_args.cut_len] if bench_args.cut_len else ids
        reqs.append(_make_req(i, prompts[i], cut, bench_args.output_len[0]))
    return prompts, input_ids, reqs


def prepare_extend_inputs_for_correctness_test(bench_args: BenchArgs, input_ids, reqs: list[Req], model_runner):
    """Append the rest of each prompt; its first cut_len tokens' KV slots, read back from req_to_token,
    become the cached prefix that the second extend attends to without recomputing."""
    for i, req in enumerate(reqs):
        req.full_untruncated_fill_ids.extend(input_ids[i][bench_args.cut_len :])
        req.fill_len = len(req.full_untruncated_fill_ids)
        req.prefix_indices = model_runner.req_to_token_pool.req_to_token[req.req_pool_idx, : bench_args.cut_len].long()
        req.set_extend_input_len(req.fill_len - len(req.prefix_indices))
    return reqs


def prepare_synthetic_inputs_for_latency_test(batch_size, input_len, output_len, vocab_size, seed, custom_inputs=None):
    rng = np.random.default_rng(seed)
    input_ids = custom_inputs or rng.integers(0, min(10000, vocab_size), (batch_size, input_len)).tolist()
    return [_make_req(i, "", ids, output_len) for i, ids in enumerate(input_ids)]


@torch.no_grad()
def extend(reqs: list[Req], model_runner: ModelRunner):
    batch = ScheduleBatch.init_new(
        reqs, model_runner.req_to_token_pool, model_runner.token_to_kv_pool_allocator, model_runner.model_config
    )
    batch.prepare_for_extend()
    forward_batch = ForwardBatch.init_new(batch, model_runner)
    logits_output = model_runner.forward(forward_batch).logits_output
    next_token_ids = model_runner.sample(logits_output, forward_batch)
    return next_token_ids, logits_output.next_token_logits, batch


@torch.no_grad()
def decode(input_token_ids: torch.Tensor, batch: ScheduleBatch, model_runner: ModelRunner):
    batch.input_ids = input_token_ids.to(torch.int64)
    batch.prepare_for_decode()
    forward_batch = ForwardBatch.init_new(batch, model_runner)
    logits_output = model_runner.forward(forward_batch).logits_output
    next_token_ids = model_runner.sample(logits_output, forward_batch)
    return next_token_ids, logits_output.next_token_logits


def _check_prompt_lengths(input_ids: list[list[int]], output_len: int, context_len: int) -> None:
    """Refuse a prompt that, with its generated tokens, would not fit the model's context."""
    for i, ids in enumerate(input_ids):
        if len(ids) + output_len > context_len:
            raise InputError(f"prompt {i} has {len(ids)} tokens; with --output-len {output_len} it exceeds the "
                             f"model's context length {context_len}; use a shorter prompt or output")  # fmt: skip


def _read_prompts_from_file(prompt_file: str) -> list[str]:
    if not prompt_file:
        return []
    with open(prompt_file) as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def correctness_test(server_args: ServerArgs, bench_args: BenchArgs, tp_rank: int, dist_init_method=None):
    rank_print = print if tp_rank == 0 else lambda *args, **kwargs: None
    model_runner, tokenizer = load_model(server_args, tp_rank, dist_init_method)
    custom_prompts = _read_prompts_from_file(bench_args.prompt_filename)
    prompts, input_ids, reqs = prepare_inputs_for_correctness_test(bench_args, tokenizer, custom_prompts)
    _check_prompt_lengths(input_ids, bench_args.output_len[0], model_runner.torch_runner.model_config.context_len)
    rank_print(f"\n{input_ids=}\n")

    if bench_args.cut_len > 0:
        next_token_ids, next_token_logits, batch = model_runner.extend(reqs)
        rank_print(f"prefill logits (first half): {next_token_logits} \n")
        reqs = prepare_extend_inputs_for_correctness_test(bench_args, input_ids, reqs, model_runner.torch_runner)

    next_token_ids, next_token_logits, batch = model_runner.extend(reqs)
    rank_print(f"prefill logits (final): {next_token_logits} \n")

    output_ids = [[token] for token in next_token_ids.tolist()]
    for _ in range(bench_args.output_len[0] - 1):
        next_token_ids, _ = model_runner.decode(next_token_ids, batch)
        for i, token in enumerate(next_token_ids.tolist()):
            output_ids[i].append(token)
    model_runner.cleanup(batch)

    records = []
    for i in range(len(reqs)):
        rank_print(f"========== Prompt {i} ==========")
        rank_print(tokenizer.decode(input_ids[i] + output_ids[i]), "\n")
        records.append({"run_name": bench_args.run_name, "prompt": prompts[i], "input_ids": input_ids[i],
                        "output_ids": output_ids[i], "output_text": tokenizer.decode(output_ids[i])})  # fmt: skip
    if tp_rank == 0:
        bench_utils.append_records(bench_args.result_filename, records)
    return records


def latency_test_run_once(
    run_name, model_runner, rank_print, reqs, batch_size, input_len, output_len, log_decode_step,
    profile, profile_record_shapes, profile_activities, profile_prefix, profile_stage,
    profile_start_step=None, profile_steps=None, progress=None,
):  # fmt: skip
    # Prompts from --prompt-filename may be longer than input_len: size the KV check by the longest one.
    longest = max([input_len] + [len(r.origin_input_ids) for r in reqs])
    max_batch_size = model_runner.max_batch_size(longest, output_len)
    if batch_size > max_batch_size:
        rank_print(f"skipping ({batch_size}, {input_len}, {output_len}) due to max batch size limit")
        return None
    model_runner.clear()
    measurement_results = {"run_name": run_name, "batch_size": batch_size, "input_len": input_len,
                           "output_len": output_len}  # fmt: skip
    shape = (profile_prefix, batch_size, input_len, output_len)

    profile_prefill = profile and profile_stage in ("all", "prefill")
    profiler = start_profile(profile_activities, profile_record_shapes) if profile_prefill else None
    model_runner.synchronize()
    tic = time.perf_counter()
    next_token_ids, _, batch = model_runner.extend(reqs)
    model_runner.synchronize()
    prefill_latency = time.perf_counter() - tic
    if profiler is not None:
        stop_profile(
            profiler, profile_activities, rank_print, create_torch_profiler_filename(*shape, "prefill"), "prefill"
        )
    tot_latency = prefill_latency
    throughput = input_len * batch_size / prefill_latency
    rank_print(f"Prefill. latency: {prefill_latency:6.5f} s, throughput: {throughput:9.2f} token/s")
    measurement_results["prefill_latency"] = prefill_latency
    measurement_results["prefill_throughput"] = throughput

    decode_latencies = []
    profile_start = profile_start_step if profile_start_step is not None else output_len // 2
    profile_end = profile_start + (profile_steps if profile_steps is not None else 1)
    profile_decode = profile and profile_stage in ("all", "decode")
    profiler = None
    if progress is not None:
        progress.start_decode(output_len - 1)
    for i in range(output_len - 1):
        model_runner.synchronize()
        if profile_decode and i == profile_start:
            profiler = start_profile(profile_activities, profile_record_shapes)
        tic = time.perf_counter()
        next_token_ids, _ = model_runner.decode(next_token_ids, batch)
        model_runner.synchronize()
        latency = time.perf_counter() - tic
        if profiler is not None and i >= profile_end - 1:
            stop_profile(
                profiler, profile_activities, rank_print, create_torch_profiler_filename(*shape, "decode"), "decode"
            )
            profiler = None
        tot_latency += latency
        decode_latencies.append(latency)
        if i < 5 or (log_decode_step > 0 and i % log_decode_step == 0):
            rank_print(f"Decode {i}. Batch size: {batch_size}, latency: {latency:6.5f} s, "
                       f"throughput: {batch_size / latency:9.2f} token/s")  # fmt: skip
        if progress is not None:
            progress.advance_decode()
    if profiler is not None:  # the window ran past the last step: save what was recorded
        stop_profile(
            profiler, profile_activities, rank_print, create_torch_profiler_filename(*shape, "decode"), "decode"
        )
    elif profile_decode and profile_start >= output_len - 1:
        rank_print(f"torch profiler: no decode trace; decode step {profile_start} never runs: --output-len "
                   f"{output_len} makes {output_len - 1} decode steps")  # fmt: skip

    if output_len > 1:
        med_decode_latency = float(np.median(decode_latencies))
        med_decode_throughput = batch_size / med_decode_latency
        rank_print(f"Decode.  median latency: {med_decode_latency:6.5f} s, "
                   f"median throughput: {med_decode_throughput:9.2f} token/s")  # fmt: skip
        measurement_results["median_decode_latency"] = med_decode_latency
        measurement_results["median_decode_throughput"] = med_decode_throughput

    throughput = (input_len + output_len) * batch_size / tot_latency
    rank_print(f"Total. latency: {tot_latency:6.3f} s, throughput: {throughput:9.2f} token/s")
    measurement_results["total_latency"] = tot_latency
    measurement_results["overall_throughput"] = throughput
    model_runner.cleanup(batch)
    return measurement_results


def latency_test(server_args: ServerArgs, bench_args: BenchArgs, tp_rank: int, dist_init_method=None):
    is_rank0 = tp_rank == 0
    rank_print = print if is_rank0 else lambda *args, **kwargs: None
    if bench_args.profile and server_args.enable_torch_compile:
        profile_compiled_kernels()  # before the warm-up, whose first forwards compile
    model_runner, tokenizer = load_model(server_args, tp_rank, dist_init_method)
    vocab_size = model_runner.torch_runner.model_config.vocab_size
    seed = server_args.random_seed
    common = dict(log_decode_step=0, profile=False, profile_record_shapes=False, profile_activities=("CPU",),
                  profile_prefix="", profile_stage="all")  # fmt: skip

    custom_inputs = [tokenizer.encode(p.strip()) for p in _read_prompts_from_file(bench_args.prompt_filename)]
    context_len = model_runner.torch_runner.model_config.context_len
    _check_prompt_lengths(custom_inputs[: max(bench_args.batch_size)], max(bench_args.output_len), context_len)
    il, ol = bench_args.input_len[0], min(32, bench_args.output_len[0])
    # Compiled, the first batch of a new size can compile during its run: the extend and small-decode graphs
    # specialize on batch 1, and decodes of up to min_packed_rows() requests and of more run different graphs.
    # SGLang captures its graphs for every batch size before the benchmark, so here each size is warmed up once.
    warmup_sizes = list(dict.fromkeys(bench_args.batch_size))
    if not server_args.enable_torch_compile:
        warmup_sizes = warmup_sizes[:1]
    rank_print("Warmup ...")
    for bs in warmup_sizes:
        warmup_reqs = prepare_synthetic_inputs_for_latency_test(bs, il, ol, vocab_size, seed)
        latency_test_run_once(bench_args.run_name, model_runner, rank_print, warmup_reqs, bs, il, ol, **common)
    rank_print("Benchmark ...")

    combos = list(itertools.product(bench_args.batch_size, bench_args.input_len, bench_args.output_len))
    results = []
    with bench_utils.SweepProgress(len(combos), enabled=is_rank0) as progress:
        for bs, il, ol in combos:
            inputs = None
            if custom_inputs:  # as SGLang: truncate to bs, or pad with the last prompt
                inputs = (custom_inputs + [custom_inputs[-1]] * bs)[:bs]
            reqs = prepare_synthetic_inputs_for_latency_test(bs, il, ol, vocab_size, seed, inputs)
            ret = latency_test_run_once(
                bench_args.run_name, model_runner, rank_print, reqs, bs, il, ol, bench_args.log_decode_step,
                bench_args.profile and is_rank0, bench_args.profile_record_shapes, bench_args.profile_activities,
                bench_args.profile_filename_prefix, bench_args.profile_stage, bench_args.profile_start_step,
                bench_args.profile_steps, progress,
            )  # fmt: skip
            if ret is not None:
                results.append(ret)
                if is_rank0:
                    bench_utils.append_records(bench_args.result_filename, [ret])
            progress.advance_sweep()
    if is_rank0:
        bench_utils.print_summary(results)
    return results


def work(server_args: ServerArgs, bench_args: BenchArgs, tp_rank: int = 0, dist_init_method: str | None = None):
    work_func = correctness_test if bench_args.correctness_test else latency_test
    try:
        return work_func(server_args, bench_args, tp_rank, dist_init_method)
    finally:
        destroy_distributed_environment()


def main(server_args: ServerArgs, bench_args: BenchArgs):
    if server_args.model_path is None:
        server_args.model_path = default_model_path()
    check_args(server_args, bench_args, get_config(server_args.model_path))
    # as SGLang's bench: on CUDA, graphs are captured for the batch sizes this run decodes and no larger
    server_args.cuda_graph_max_bs = max(bench_args.batch_size)
    if server_args.tp_size == 1:
        return work(server_args, bench_args)
    return launch_tp(work, server_args, bench_args)


def parse_args(argv: list[str] | None = None) -> tuple[ServerArgs, BenchArgs]:
    parser = bench_utils.OneLineErrorParser(
        prog="python -m minisgl.bench_one_batch", description=__doc__.split("\n")[0]
    )
    ServerArgs.add_cli_args(parser)
    BenchArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    return ServerArgs.from_cli_args(args), BenchArgs.from_cli_args(args)


def cli(argv: list[str] | None = None) -> int:
    server_args, bench_args = parse_args(argv)
    try:
        main(server_args, bench_args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except TPRankError as e:  # a rank's own traceback is not shown; its one-line error is
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(cli())
