"""CPUGraphRunner (``--enable-torch-compile``): the model's forward compiled by TorchInductor.

Eagerly, a decode step of a small model launches about a thousand small kernels from Python (two RMSNorms,
RoPE, SiLU and residual adds per layer, each a few kernels); at batch 1 that framework time is a fifth of
SmolLM2's step. Compiled, the elementwise work between the matmuls fuses into a few C++ loops and the
weights are frozen into packed layouts (oneDNN's, or Inductor's own GEMM template's; a long prefill's linears
keep the plain weight where MKL's GEMM is the faster, see ``traced_gemm_on_plain_weight``). Decode attention and
a single request's extend are traced into the graph too, K/V write included (on CPU its causal attention calls
minisgl's C++ kernel there as an opaque op, ``minisgl_cpu::causal_prefill_attention``; where that is not built,
an extend past one 128-token tile, where the tiles apply, calls the opaque ``minisgl::causal_prefill_attention``);
the attention of an extend of several requests runs as one opaque custom op per layer
(``minisgl::unified_attention``), which finds its batch through the forward context.

One general graph serves every batch size: the batch dimension is symbolic (``dynamic=True``), which also
makes Inductor pack linear weights for oneDNN, the faster kernel here (its static-shape choice, MKL's packed
GEMM, is ~2.5x slower at decode). On CPU, decode batches of fewer than ``min_packed_rows()`` requests are padded
to that many rows, as ``apply_linear`` pads its input eagerly (four where a probe finds oneDNN's 4-row kernel
the faster, only ever on CPUs with AMX; one, so no padding, elsewhere; see ``prepare_replay``), and decodes of
that many rows run a second graph, compiled with max-autotune for that one shape (see ``__init__``; float32
always, 16-bit only on CPUs with AMX: ``tunes_small_decodes``). Where the linears keep column-blocked copies
(``keep_blocked_copies``, as a probe decides per dtype), the graphs of up to ``BLOCKED_MAX_ROWS`` rows call minisgl's
C++ kernel on them as an opaque op instead, and small decodes are neither padded nor tuned. The first
forward of each graph compiles (about two minutes on two cores for SmolLM2's extend and small decode; later
processes reuse Inductor's on-disk cache);
extends of one request and of several compile separate graphs, as dynamo specializes a dimension of size 1,
and so do padded small decodes of one request and of two or three (the rows that attend). An extend past one
MLP block (``LlamaMLP``) or, where the tiles apply (the C++ prefill kernel not built), past one query tile
compiles its own graph once, on the other side of that length guard. Each graph freezes its own packed copy of
the weights it multiplies (not those the C++ kernel reads), beside the module's plain ones that eager batches use
(SmolLM2 float32, RSS in one process after load, a 1x128 and an 8x128 run: 2.4, 2.8, 3.0 GB with the blocked
copies; 1.8, 3.6, 4.1 without, when every decode graph froze a packed copy).

SGLang's ``CPUGraphRunner`` compiles one static graph per decode batch size at start-up and pads a batch up
to the next captured size the same way; prefill stays eager there. Its CUDA counterpart captures CUDA
graphs, which minisgl does not: on CUDA the same compiled forward runs without graph capture.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from minisgl.layers.amx_utils import (
    CPU_MULTIPLIES_BFLOAT16,
    blocked_linear_is_faster,
    min_packed_rows,
    mkl_gemm_is_faster,
)
from minisgl.layers.cpu_kernels import cpu_kernels_built
from minisgl.layers.logits_processor import LogitsProcessorOutput
from minisgl.layers.radix_attention import RadixAttention
from minisgl.model_executor.forward_batch_info import ForwardBatch
from minisgl.model_executor.forward_context import ForwardContext, forward_context
from minisgl.model_executor.runner.base_runner import BaseRunner

if TYPE_CHECKING:
    from minisgl.model_executor.model_runner import ModelRunner


def set_torch_compile_config() -> None:
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True  # reuse compiled graphs across processes
    inductor_config.freezing = True  # weights become constants: packed once, at compile time
    # Fused 16-bit elementwise chains round where eager rounds, so bfloat16 results stay as close to HF's.
    inductor_config.emulate_precision_casts = True
    # Each model instance and forward mode is its own compiled graph; several runners in one process (tests,
    # two dtypes of one model) would exceed dynamo's default of 8 and silently fall back to eager.
    dynamo_config.cache_size_limit = dynamo_config.accumulated_cache_size_limit = 1024
    # The modules' float attributes (RMSNorm's epsilon, attention's scaling) become constants. Traced as symbolic
    # floats, each is specialized again with a guard that runs in Python before every call (74 of them for
    # dummy134's 12 layers). With the KV pool static (CPUGraphRunner), dynamo's check before each compiled batch-1
    # float32 decode, profiled: SmolLM2 422 -> 234 us, dummy134 247 -> 193 us, of a 12-17 ms step.
    dynamo_config.specialize_float = True
    # Inductor's autotuner itself calls the deprecated Tensor.storage() (torch 2.13); the warning is not the user's.
    warnings.filterwarnings("ignore", message="TypedStorage is deprecated", category=UserWarning)


def profile_compiled_kernels() -> None:
    """Have each of Inductor's C++ kernels record itself in a torch profile, for ``--profile`` with
    ``--enable-torch-compile``: a compiled CPU forward then shows its fused decode attention, its other fused
    loops and, where autotuning picked Inductor's GEMM template (the small-decode graph), that template's kernels
    (one ``gemm_m<rows>n<out>k<in>`` per linear shape) one by one, where otherwise the whole graph is one
    ``CompiledFxGraph`` call; oneDNN's linears appear as their own calls either way. It must be set before the first
    compile; graphs compiled with it are cached apart from those without. CUDA kernels are profiled anyway."""
    import torch._inductor.config as inductor_config

    inductor_config.cpp.enable_kernel_profile = True


@functools.cache
def register_fake_ops() -> None:
    """Shape-only versions of minisgl's C++ CPU ops that compiled graphs call (``blocked_linear``, the prefill's
    ``causal_prefill_attention``): dynamo traces
    them instead of the kernels, which take only concrete sizes, and Inductor calls the kernels as they are. Once
    per process, where the kernels are built. SGLang's ``register_fake_ops`` registers such fakes for every
    sgl_kernel CPU op (attention, norms, MoE, quantized GEMMs) and makes Inductor fall back to each."""

    @torch.library.register_fake("minisgl_cpu::blocked_linear")
    def _(x: torch.Tensor, blocked: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
        return x.new_empty(x.shape[0], out_features)

    @torch.library.register_fake("minisgl_cpu::causal_prefill_attention")
    def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        return q.new_empty(q.shape)


def keep_weight_identity_guards(guard_entries: list) -> list[bool]:
    """Which of dynamo's guards to check before each compiled call.

    The model's modules never change after loading, so the hundreds of guards on their attributes, hooks and
    weights (~0.5 ms per call for SmolLM2's 30 layers) are dropped, all but the identity of one weight: that
    one tells models apart, so another model in the same process (tests, another dtype) cannot run this graph.
    """
    keep, identity_kept = [], False
    for guard in guard_entries:
        on_module = guard.orig_guard.source.is_unspecialized_nn_module()
        # A parameter, not a buffer: models with the same rope configuration share one RotaryEmbedding.
        is_weight = guard.has_value and isinstance(guard.value, torch.nn.Parameter)
        identity = on_module and guard.guard_type == "ID_MATCH" and is_weight and not identity_kept
        identity_kept |= identity
        keep.append(not on_module or identity)
    return keep


def compile_options(**inductor_options) -> dict:
    """``torch.compile``'s options for one compile, ``keep_weight_identity_guards`` included. A fresh dict per
    call: ``torch.compile`` pops the guard filter out of the dict it is given, so a shared dict would leave every
    later compile with all its guards (the small-decode graph ran with SmolLM2's ~5,000 guards, ~1.1 ms a call
    to check, until this)."""
    return {"guard_filter_fn": keep_weight_identity_guards, **inductor_options}


def tunes_small_decodes(dtype: torch.dtype) -> bool:
    """Whether small CPU decodes of ``dtype`` get the max-autotune graph: never where the linears keep column-blocked
    copies (``blocked_linear_is_faster``), whose C++ kernel the graphs of a few rows call instead of any GEMM;
    else float32 always, and 16-bit only on CPUs with AMX, whose tiles the template's 16-bit kernels multiply in.

    With the copies there is nothing left to tune: SmolLM2 float32 batch 1, 1,128,16, AMD EPYC Zen 3 (AVX2), the
    two graphs alternated in one process (median of 6), tuned 20.0 against general 19.8 ms/step. Before the copies
    the tuned graph's GEMM template read the weights as fast as the kernel does (20.0 against 20.9 ms/step with the
    copies, the same tuned graph).

    Without AMX (AVX512-BF16, AMD EPYC Zen 5), the tuned bfloat16 step makes no oneDNN call (the timing picked the
    template) and is slower than the general graph, where oneDNN's packed kernels run the same linears: in-process
    A/B of two compiled engines, batch 1, 1,128,32, six alternating runs, ms/step, tuned -> general: SmolLM2
    12.48 -> 9.19, dummy134 8.00 -> 6.18. Float32 goes the other way there (SmolLM2 8.93 tuned, 25.03 general),
    and bfloat16 did on a Xeon VM with AMX (SmolLM2 at four rows 21.9 -> 19.3 ms/step tuned).
    """
    if blocked_linear_is_faster(dtype):
        return False
    return dtype == torch.float32 or torch.cpu._is_amx_tile_supported()


class CPUGraphRunner(BaseRunner):
    def __init__(self, model_runner: ModelRunner):
        set_torch_compile_config()
        self.device = model_runner.device
        if self.device.type == "cpu" and cpu_kernels_built():
            register_fake_ops()
        self.max_bs = model_runner.server_args.torch_compile_max_bs
        layers = [m for m in model_runner.model.modules() if isinstance(m, RadixAttention)]
        self.attention_layers = sorted(layers, key=lambda layer: layer.layer_id)
        # The KV pool never changes size: static, each buffer's size is checked in dynamo's C++ guards, where a
        # symbolic one needs a Python guard per buffer that its size equals the first's (dynamo's duck sizing).
        pool = model_runner.token_to_kv_pool
        for buffer in (*pool.k_buffer, *pool.v_buffer):
            torch._dynamo.mark_static(buffer)
        self.compiled_forward = torch.compile(model_runner.model.forward, dynamic=True, options=compile_options())
        # Probed at load, not in the trace of a long prefill (traced_gemm_on_plain_weight), and only where a traced
        # linear multiplies in float32: a 16-bit weight that oneDNN multiplies as it is never takes MKL's GEMM.
        dtype = model_runner.model_config.dtype
        if self.device.type == "cpu" and (dtype == torch.float32 or not CPU_MULTIPLIES_BFLOAT16):
            mkl_gemm_is_faster()
        # Decode batches of up to min_packed_rows() requests all run as that many padded rows, one shape that gets
        # its own graph tuned for it: max-autotune times Inductor's C++ GEMM template against the ATen
        # kernel for each linear and keeps the faster. At these rows the template streams the weights at the
        # machine's read bandwidth, where oneDNN reaches about three quarters of it (SmolLM2 float32 batch 1,
        # Xeon with AMX, four rows: 33.6 -> 24.2 ms/step). Tuned for four rows, it is slower at 8 and 32, so
        # larger batches keep the general graph. Where min_packed_rows() is 1, only batch-1 decodes run it,
        # unpadded: padded to four they were slower (AMD Zen 5, SmolLM2 float32, in-process A/B in the VM's
        # fast phase: 11.1 -> 9.2 ms/step; equal in its slow phase; on a later Xeon VM with AMX, whose 1-row
        # kernel the probe finds the faster, 33.6 -> 24.9). The tuning adds about a minute to the first small
        # decode's compile (SmolLM2, 2 cores). On CUDA nothing is padded, and every decode runs the general graph.
        self.compiled_small_decode = self.compiled_forward
        # the rows small decodes are padded to, where they get the tuned graph (see tunes_small_decodes)
        self.small_decode_rows: int | None = None
        if self.device.type == "cpu" and tunes_small_decodes(model_runner.model_config.dtype):
            self.small_decode_rows = min_packed_rows()  # probed at load, not in a decode a benchmark may time
            autotune = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
                        # the timings stay quiet: no table per linear on stderr
                        "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}  # fmt: skip
            self.compiled_small_decode = torch.compile(
                model_runner.model.forward, dynamic=True, options=compile_options(**autotune)
            )

    def can_run_graph(self, forward_batch: ForwardBatch) -> bool:
        """Extend always; decode up to ``--torch-compile-max-bs`` requests (larger batches run eagerly)."""
        return forward_batch.forward_mode.is_extend() or forward_batch.batch_size <= self.max_bs

    def prepare_replay(self, forward_batch: ForwardBatch) -> ForwardBatch:
        """The batch the graph runs, with the attention metadata built for it.

        On CPU, a decode of fewer than ``small_decode_rows`` requests gets padding rows up to that many, for the
        linears: each is one token that writes its K/V to the reserved slot 0 of the KV pool, which real
        requests never read unmasked. The attention metadata is built before padding, so it covers the real
        requests only and the padding rows skip attention (see ``forward_decode``). SGLang's
        ``prepare_replay`` pads to the next captured batch size with padding requests in the same reserved
        ``req_to_token`` row and slot, and they attend.
        """
        forward_batch.attn_backend.init_forward_metadata_out_graph(forward_batch)
        padding = 0
        if forward_batch.forward_mode.is_decode() and self.small_decode_rows:
            padding = max(0, self.small_decode_rows - forward_batch.batch_size)
        if padding:
            # Only what the graph reads: the pool-row and length fields fed the metadata, built above.
            forward_batch = dataclasses.replace(
                forward_batch,
                batch_size=forward_batch.batch_size + padding,
                input_ids=F.pad(forward_batch.input_ids, (0, padding)),
                positions=F.pad(forward_batch.positions, (0, padding)),
                out_cache_loc=F.pad(forward_batch.out_cache_loc, (0, padding)),
            )
        return forward_batch

    def execute(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        batch = self.prepare_replay(forward_batch)
        small_decode = batch.forward_mode.is_decode() and batch.batch_size == self.small_decode_rows
        compiled_forward = self.compiled_small_decode if small_decode else self.compiled_forward
        with forward_context(ForwardContext(batch, self.attention_layers)):
            output = compiled_forward(batch.input_ids, batch.positions, batch)
        if batch.batch_size != forward_batch.batch_size:
            output = LogitsProcessorOutput(next_token_logits=output.next_token_logits[: forward_batch.batch_size])
        return output
