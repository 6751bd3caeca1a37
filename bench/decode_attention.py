"""Decode attention per layer beside its floor: the C++ kernel, gather + SDPA and the compiled kernel.

    python bench/decode_attention.py                     # SmolLM2's and dummy134's heads, float32 (~5 min on 2 cores)
    python bench/decode_attention.py --models dummy134 --dtypes bfloat16 --batches 32 --contexts 256 --reps 5

A decode step's attention reads every cached key and value of its requests once, so its floor is those bytes at
the machine's read bandwidth (``perf.read_bandwidth``, sampled before and after each row). This times
``TorchNativeAttnBackend.forward_decode`` on the model's head shapes over all of its layers, each layer with its
own pool as in a step, and the caches flushed before each pass (the K/V come from memory, not from the cache a
repeated call would leave them in; ``--warm`` leaves them there, to tell a kernel bound by its reads from one bound
by its instructions): *eager*, as an eager step runs it (on CPU the C++ kernel of ``cpu_decode.py``, reading the
pool in place), *sdpa*, the eager path it replaced and falls back to (K/V gathered, then SDPA), and *compiled*,
the same calls traced into one graph, as ``CPUGraphRunner``'s forward runs them (``fused_decode_attention``,
reading the pool in place), a GEMM between two layers as in the model (``all_layers_step``), the three passes
alternating between repetitions. All include the new token's K/V write. Each request's cached positions lie in
consecutive slots, as a prefill leaves them. The table shows microseconds per layer (median) and the share of the
floor each reaches. At long contexts the attention is the part of a compiled decode step that keeps it from the
weights' bandwidth floor (issue #5): this shows how far each kernel is from its own.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from types import SimpleNamespace

import torch
from engines import DTYPES, MODELS, dummy_model, model_paths
from perf import read_bandwidth
from rich.console import Console
from rich.table import Table

from minisgl.layers.amx_utils import alternating_seconds
from minisgl.layers.attention.torch_native_backend import TorchNativeAttnBackend
from minisgl.layers.radix_attention import RadixAttention
from minisgl.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from minisgl.model_executor.cpu_graph_runner import set_torch_compile_config
from minisgl.model_executor.forward_batch_info import ForwardMode

CPU = torch.device("cpu")
# Written before each timed pass (untimed): past a server CPU's L3 share. In a step, a layer's weights go through
# the caches between two layers' attention, so its K/V are read from memory.
FLUSH_BYTES = 64 << 20
# The timed passes, in the table's order (attention_passes).
PASSES = ("eager", "sdpa", "compiled")


def attention_layers(model_path: str) -> list[RadixAttention]:
    """The attention layers of minisgl's model for ``model_path`` (``dummy_model``), in layer order."""
    layers = [m for m in dummy_model(model_path).modules() if isinstance(m, RadixAttention)]
    return sorted(layers, key=lambda layer: layer.layer_id)


def kv_pool(layers: list[RadixAttention], dtype: torch.dtype, slots: int) -> MHATokenToKVPool:
    """A KV pool of random K/V for every layer, with ``slots`` slots past the reserved slot 0, shared by a table's
    rows. Its buffers are static to the compiled step, as ``CPUGraphRunner`` marks a runner's pool, so rows differ
    in symbolic sizes only: one graph for batch 1 and one for larger batches (dynamo specializes a size of 1)."""
    pool = MHATokenToKVPool(slots + 1, dtype, layers[0].tp_k_head_num, layers[0].head_dim, len(layers), CPU)
    for buffer in (*pool.k_buffer, *pool.v_buffer):
        buffer.copy_(torch.randn(buffer.shape).to(dtype))
        torch._dynamo.mark_static(buffer)
    return pool


def decode_batch(pool: MHATokenToKVPool, batch: int, context: int) -> SimpleNamespace:
    """A decode step's batch: ``batch`` requests with ``context`` cached positions each, then the new token, in one
    run of consecutive slots per request (from slot 1)."""
    seq_len = context + 1
    req_to_token_pool = ReqToTokenPool(batch, seq_len, CPU)  # row 0 reserved, as the pool keeps it
    slots = torch.arange(1, batch * seq_len + 1, dtype=torch.int32).view(batch, seq_len)
    req_to_token_pool.req_to_token[1:] = slots
    lens = torch.full((batch,), seq_len)
    return SimpleNamespace(forward_mode=ForwardMode.DECODE, req_to_token_pool=req_to_token_pool,
                           req_pool_indices=torch.arange(1, batch + 1), seq_lens=lens, seq_lens_cpu=lens,
                           token_to_kv_pool=pool, out_cache_loc=slots[:, -1].long())  # fmt: skip


def kv_bytes(forward_batch: SimpleNamespace) -> int:
    """The K/V bytes one layer's decode attention reads: every position of every request, keys and values."""
    layer_keys = forward_batch.token_to_kv_pool.k_buffer[0]  # [slots, kv_heads, head_dim]
    positions = int(forward_batch.seq_lens.sum())
    return 2 * positions * layer_keys[0].numel() * layer_keys.element_size()


def new_tokens(layers: list[RadixAttention], forward_batch: SimpleNamespace) -> tuple[torch.Tensor, ...]:
    """The step's q, k, v: one new token per request, random, in the pool's dtype."""
    heads, kv_heads, head_dim = layers[0].tp_q_head_num, layers[0].tp_k_head_num, layers[0].head_dim
    batch, dtype = len(forward_batch.seq_lens), forward_batch.token_to_kv_pool.dtype
    return tuple(torch.randn(batch, n, head_dim).to(dtype) for n in (heads, kv_heads, kv_heads))


def attention_passes(layers: list[RadixAttention], forward_batch: SimpleNamespace, compiled_step, qkv):
    """The eager, the gather + SDPA and the compiled pass over all layers, each with its backend's metadata built
    as its runner builds it (``init_forward_metadata`` eagerly, ``init_forward_metadata_out_graph`` for the graph)."""
    eager, sdpa, traced = (
        TorchNativeAttnBackend(),
        TorchNativeAttnBackend(use_decode_kernel=False),
        TorchNativeAttnBackend(),
    )
    eager.init_forward_metadata(forward_batch)
    sdpa.init_forward_metadata(forward_batch)
    traced.init_forward_metadata_out_graph(forward_batch)

    def eager_pass() -> list[torch.Tensor]:
        return all_layers_step(eager, *qkv, layers, forward_batch)

    def sdpa_pass() -> list[torch.Tensor]:
        return all_layers_step(sdpa, *qkv, layers, forward_batch)

    def compiled_pass() -> list[torch.Tensor]:
        return compiled_step(traced, *qkv, layers, forward_batch)

    return eager_pass, sdpa_pass, compiled_pass


def all_layers_step(backend, q, k, v, layers, forward_batch) -> list[torch.Tensor]:
    """Every layer's decode attention of one step, in the backend's ``forward_decode``, with a GEMM between two
    layers as in a model, whose linears are calls of their own: compiled, each layer's attention is then a kernel of
    its own, as in the model's graph (without it Inductor puts all 30 of SmolLM2's layers in one kernel, at 8 x 512
    1.4-1.6x slower per layer). The GEMM (the output times zeros, added to q: a few us per layer, in both passes)
    leaves q's values as they are."""
    zeros = q.new_zeros(q.shape[-1], q.shape[-1])
    outs = []
    for layer in layers:
        outs.append(backend.forward_decode(q, k, v, layer, forward_batch))
        q = q + torch.mm(outs[-1].view(-1, q.shape[-1]), zeros).view(q.shape)
    return outs


def measure(
    layers, pool, batch: int, context: int, compiled_step, reps: int, warm: bool = False
) -> tuple[int, float, list[float]]:
    """One row: a layer's K/V bytes, the read bandwidth (median of a sample before and one after the passes), and
    the eager, the sdpa and the compiled pass's seconds per layer (alternating, the first round a warm-up where the
    graph compiles; the caches flushed before each pass unless ``warm``)."""
    forward_batch = decode_batch(pool, batch, context)
    passes = attention_passes(layers, forward_batch, compiled_step, new_tokens(layers, forward_batch))
    flush = torch.zeros(0 if warm else FLUSH_BYTES, dtype=torch.uint8)
    bandwidth = read_bandwidth()
    seconds = alternating_seconds(passes, reps, before_each=None if warm else lambda: flush.add_(1))
    bandwidth = statistics.median([bandwidth, read_bandwidth()])
    return kv_bytes(forward_batch), bandwidth, [s / len(layers) for s in seconds]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["smollm2", "dummy134"], choices=MODELS)
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=list(DTYPES))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--contexts", nargs="+", type=int, default=[128, 512, 2048], help="cached positions")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--warm", action="store_true", help="no cache flush before a pass: K/V read from cache")
    args = parser.parse_args(argv)
    if min(args.batches) < 1 or min(args.contexts) < 1 or args.reps < 1:
        parser.error("--batches, --contexts and --reps: 1 or more")
    set_torch_compile_config()
    # One graph for every shape here (the batch and the positions are symbolic), as the general decode graph.
    compiled_step = torch.compile(all_layers_step, dynamic=True)
    console = Console(width=160)  # ten columns, unwrapped also when piped to a file (rich's 80 there)
    with tempfile.TemporaryDirectory(prefix="minisgl-attention-") as scratch:  # the random models' configs
        paths = model_paths(args.models, scratch)
        layers_of = {model_name: attention_layers(paths[model_name]) for model_name in args.models}
    for model_name, layers in layers_of.items():
        for dtype_name in args.dtypes:
            caches = "warm caches" if args.warm else "K/V from memory"
            table = Table(title=f"{model_name} {dtype_name}: decode attention, us per layer (median; {caches})")
            for column in ("batch x context", "K/V MB per layer", "GB/s", "floor", *PASSES,
                           *(f"floor / {name}" for name in PASSES)):  # fmt: skip
                table.add_column(column)
            pool = kv_pool(layers, DTYPES[dtype_name], max(args.batches) * (max(args.contexts) + 1))
            for batch in args.batches:
                for context in args.contexts:
                    layer_bytes, bandwidth, seconds = measure(layers, pool, batch, context, compiled_step,
                                                              args.reps, args.warm)  # fmt: skip
                    floor, times = 1e6 * layer_bytes / bandwidth, [1e6 * s for s in seconds]
                    table.add_row(f"{batch} x {context}", f"{layer_bytes / 1e6:.2f}", f"{bandwidth / 1e9:.0f}",
                                  f"{floor:.1f}", *(f"{us:.0f}" for us in times),
                                  *(f"{floor / us:.0%}" for us in times))  # fmt: skip
            del pool
            console.print(table)


if __name__ == "__main__":
    main()
