"""DecodeCudaGraphRunner: on CUDA, each decode step replayed from a captured CUDA graph, one launch for the model.

A small model's eager decode step on a GPU is the host launching several hundred kernels one by one, and the GPU
waits on it: on an H200, dummy134's float32 step at batch 1 took 5.7-9.0 ms eagerly where its linears alone,
replayed from a graph, take 0.3 ms. A CUDA graph records the step's kernels once and replays them with one call:
eager -> replayed, median ms/step, two runs on one H200 (``bench/results-cuda-no-graph.json`` ->
``bench/results-cuda.json``): dummy134 float32 1x128 9.0 -> 1.5, 8x128 8.1 -> 2.1; bfloat16 8x128 11.9 -> 1.4;
SmolLM2's shape float32 1x128 13.6 -> 2.8, bfloat16 32x256 20.0 -> 3.5 (HF: 12.0, 9.8, 15.8, 24.9, 53.7).
A graph also fixes every shape and address the capture saw, so the runner keeps static input buffers, pads a
batch up to the next captured batch size (padding rows write their K/V to the reserved slot 0 and attend to it
alone), and writes the attention metadata into the graph's own tensors before each replay.

minisgl's torch-native decode gathers each request's K/V up to a length, so a graph is captured per batch size
*and* padded sequence length (powers of two from 128 up to the context length), all at start-up. SGLang's
``DecodeCudaGraphRunner`` captures one graph per batch size: its FlashInfer/Triton backends read the lengths from
``kv_indptr``/page tables in static buffers, so no length is baked in. It also captures through torch.compile
and for tensor parallelism (custom all-reduce), speculative verify, LoRA and DP-attention padding; here
``--enable-torch-compile`` and ``--tp-size`` above 1 run without graphs.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from minisgl.layers.attention.torch_native_backend import DecodeMetadata, TorchNativeAttnBackend
from minisgl.layers.logits_processor import LogitsProcessorOutput
from minisgl.layers.rotary_embedding import RotaryEmbedding
from minisgl.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from minisgl.model_executor.runner.base_runner import BaseRunner

if TYPE_CHECKING:
    from minisgl.model_executor.model_runner import ModelRunner

_SHORTEST_CAPTURED_LEN = 128  # a decode step's K/V are gathered for at least this many positions


def generate_decode_cuda_graph_batch_sizes(max_bs: int) -> list[int]:
    """SGLang's default ladder of decode batch sizes, up to and including ``max_bs``: 1, 2, 4, 8, 12, then every
    8 to 256, every 16 to 512, every 32 beyond. A batch runs the graph of the next size up. (SGLang's
    ``get_batch_sizes_to_capture`` then drops sizes above the request rows, as ``__init__`` does here.)"""
    ladder = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    return sorted({bs for bs in ladder if bs <= max_bs} | {max_bs})


def get_seq_lens_to_capture(context_len: int) -> list[int]:
    """The padded K/V lengths a graph is captured for: powers of two from 128, and the context length last."""
    lengths, length = [], _SHORTEST_CAPTURED_LEN
    while length < context_len:
        lengths.append(length)
        length *= 2
    return [*lengths, context_len]


def _pad_to_bucket(raw_size: int, buckets: list[int]) -> int:
    """The smallest bucket that holds ``raw_size`` (``can_run_graph`` has rejected anything larger)."""
    return buckets[bisect.bisect_left(buckets, raw_size)]


class DecodeCudaGraphRunner(BaseRunner):
    def __init__(self, model_runner: ModelRunner):
        self.model_runner = model_runner
        # as SGLang, no larger than the number of request rows
        max_bs = min(model_runner.server_args.cuda_graph_max_bs, model_runner.req_to_token_pool.size)
        self.capture_bs = generate_decode_cuda_graph_batch_sizes(max_bs)
        # no sequence outgrows the context nor the KV pool: no graph (nor its gather workspace) longer than both
        longest = min(model_runner.model_config.context_len, model_runner.max_total_num_tokens)
        self.capture_seq_lens = get_seq_lens_to_capture(longest)
        max_bs, device = self.capture_bs[-1], model_runner.device
        # The inputs every graph reads, sized for the largest batch; a graph of bs rows reads the first bs.
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.out_cache_loc = torch.zeros(max_bs, dtype=torch.int64, device=device)
        # An attention backend of the graphs' own: its gather workspaces are the ones recorded in the graphs, so
        # an eager decode (a batch above the largest captured) growing the model runner's cannot free them.
        # Gather + SDPA, as on a GPU, also where tests replay the graphs' forwards on CPU: the captured metadata
        # holds masks over static buffers, not the lengths the C++ CPU decode kernel reads.
        self.attn_backend = TorchNativeAttnBackend(use_decode_kernel=False)
        # the model's rotary tables (shared by its layers): each capture makes them look up again (run_once)
        self.ropes = list({id(m): m for m in model_runner.model.modules() if isinstance(m, RotaryEmbedding)}.values())
        # (bs, seq_len) -> the captured graph's replay (its bound method keeps the graph alive)
        self.replays: dict[tuple[int, int], Callable[[], None]] = {}
        self.metadata: dict[tuple[int, int], DecodeMetadata] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}  # the logits each replay writes
        self.memory_pool = None  # one private pool for all graphs: they never run at the same time
        self.warmup_stream = torch.cuda.Stream(device) if device.type == "cuda" else None  # one for every capture
        self.capture()

    def can_run_graph(self, forward_batch: ForwardBatch) -> bool:
        return forward_batch.forward_mode.is_decode() and forward_batch.batch_size <= self.capture_bs[-1]

    def capture(self) -> None:
        """Every (batch size, length) graph, the largest first: its workspaces are the largest, so smaller
        captures reuse them rather than grow them (a grown buffer would free memory an earlier graph writes to).
        On the current device, which ``init_distributed_environment`` made the runner's own."""
        for bs in reversed(self.capture_bs):
            for seq_len in reversed(self.capture_seq_lens):
                self.capture_one_shape(bs, seq_len)

    def capture_one_shape(self, bs: int, seq_len: int) -> None:
        """Record one decode forward of ``bs`` rows, each attending to ``seq_len`` K/V positions (at capture all
        point at slot 0: the inputs are whatever the static buffers hold, and the replays overwrite them)."""
        metadata = DecodeMetadata(
            kv_indices=torch.zeros(bs, seq_len, dtype=torch.int32, device=self.input_ids.device),
            valid=torch.zeros(bs, seq_len, dtype=torch.bool, device=self.input_ids.device),
            ragged=True,  # padding positions and rows: the mask is always applied
        )
        metadata.valid[:, 0] = True
        self.metadata[(bs, seq_len)] = metadata
        batch = self._static_batch(bs)

        def run_once() -> torch.Tensor:
            # Per-forward caches a warm-up filled must be rebuilt inside the capture, or the graph would read the
            # warm-up's tensors forever: the rotary cos/sin lookup, and the metadata's head-major K/V rows.
            metadata.head_major_rows = None
            self.attn_backend.forward_metadata = metadata
            for rope in self.ropes:
                rope.forget_lookup()
            return self.model_runner.model.forward(batch.input_ids, batch.positions, batch).next_token_logits

        key = (bs, seq_len)
        self.replays[key], self.outputs[key] = self._record(run_once)

    def _static_batch(self, bs: int) -> ForwardBatch:
        """A decode ``ForwardBatch`` of ``bs`` rows over the static buffers (only what the model reads)."""
        runner = self.model_runner
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=bs, input_ids=self.input_ids[:bs],
            req_pool_indices=None, seq_lens=None, seq_lens_cpu=None, out_cache_loc=self.out_cache_loc[:bs],
            positions=self.positions[:bs], sampling_info=None, req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool=runner.token_to_kv_pool, attn_backend=self.attn_backend,
        )  # fmt: skip

    def _record(self, run_once: Callable[[], torch.Tensor]):
        """Capture ``run_once`` into a CUDA graph: its replay, and the static output it writes."""
        # Warm-up runs first, outside the graph: lazy one-time work (cuBLAS handles, the backend's workspaces)
        # must not be recorded. On a side stream, as torch.cuda.graphs asks.
        stream = self.warmup_stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                run_once()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.memory_pool):
            output = run_once()
        self.memory_pool = graph.pool()
        return graph.replay, output

    def load_batch(self, forward_batch: ForwardBatch) -> tuple[int, int]:
        """Copy the batch into the static buffers of the graph that fits it, padded; return that graph's key."""
        raw_bs = forward_batch.batch_size
        bs = _pad_to_bucket(raw_bs, self.capture_bs)
        exact = TorchNativeAttnBackend.decode_metadata(forward_batch)  # [raw_bs, the longest sequence]
        seq_len = _pad_to_bucket(exact.kv_indices.shape[1], self.capture_seq_lens)
        for static, value in ((self.input_ids, forward_batch.input_ids), (self.positions, forward_batch.positions),
                              (self.out_cache_loc, forward_batch.out_cache_loc)):  # fmt: skip
            static[:raw_bs].copy_(value)
            static[raw_bs:bs].zero_()  # padding rows: token 0 at position 0, its K/V into the reserved slot 0
        metadata, width = self.metadata[(bs, seq_len)], exact.kv_indices.shape[1]
        metadata.kv_indices.zero_()
        metadata.kv_indices[:raw_bs, :width].copy_(exact.kv_indices)
        metadata.valid.zero_()
        metadata.valid[:, 0] = True  # a padding row attends to slot 0 alone: a fully masked row would give NaN
        metadata.valid[:raw_bs, :width].copy_(exact.valid)
        return bs, seq_len

    def execute(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        """Replay the decode step. The logits are the graph's output buffer, valid until the next replay of any
        graph (all graphs share one memory pool): sample from them, or clone them to keep them."""
        key = self.load_batch(forward_batch)
        self.replays[key]()
        return LogitsProcessorOutput(next_token_logits=self.outputs[key][: forward_batch.batch_size])


def uses_cuda_graphs(model_runner: ModelRunner) -> bool:
    """Graphs on CUDA unless ``--disable-cuda-graph``, ``--enable-torch-compile`` or tensor parallelism."""
    sa = model_runner.server_args
    return model_runner.device.type == "cuda" and not (
        sa.disable_cuda_graph or sa.enable_torch_compile or sa.tp_size > 1
    )
