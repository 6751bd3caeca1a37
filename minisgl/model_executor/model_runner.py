"""ModelRunner: owns the model, the KV pools, the attention backend and the sampler of one TP rank.

``forward(forward_batch)`` runs the model and returns the logits output (the last position of each
request in extend mode); ``sample(logits_output, forward_batch)`` turns it into next-token ids.
SGLang's ``ModelRunner`` also captures prefill (piecewise) CUDA graphs, profiles memory for the pools, initialises
LoRA, speculative draft models, expert-parallel MoE and elastic/remote weight updates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.configs.model_config import ModelConfig
from minisgl.distributed.parallel_state import init_distributed_environment
from minisgl.layers.attention.cpu_decode import KERNEL_DTYPES, decode_attention_op
from minisgl.layers.attention.torch_native_backend import TorchNativeAttnBackend
from minisgl.layers.linear import keep_blocked_copies, prepack_linear_weights
from minisgl.layers.logits_processor import LogitsProcessorOutput
from minisgl.layers.sampler import Sampler
from minisgl.layers.vocab_parallel_embedding import prepack_lm_head
from minisgl.mem_cache.allocator import TokenToKVPoolAllocator
from minisgl.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from minisgl.model_executor.cpu_graph_runner import CPUGraphRunner
from minisgl.model_executor.forward_batch_info import ForwardBatch
from minisgl.model_executor.runner.base_runner import BaseRunner
from minisgl.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner, uses_cuda_graphs
from minisgl.model_loader.loader import get_model
from minisgl.server_args import ServerArgs
from minisgl.utils.common import InputError, get_available_memory, keep_freed_cpu_memory

_MAX_NUM_REQS = 1024  # rows of req_to_token; SGLang derives it from --max-running-requests


@dataclass
class ModelRunnerOutput:
    logits_output: LogitsProcessorOutput


class ModelRunner:
    def __init__(
        self,
        model_config: ModelConfig,
        server_args: ServerArgs,
        device: torch.device,
        tp_rank: int = 0,
        dist_init_method: str | None = None,
    ):
        self.model_config = model_config
        self.server_args = server_args
        self.device = device
        self.tp_rank, self.tp_size = tp_rank, server_args.tp_size
        init_distributed_environment(tp_rank, self.tp_size, dist_init_method, device)
        torch.manual_seed(server_args.random_seed)
        if device.type == "cpu":
            # Activations reuse freed heap pages instead of fresh ones the OS must fault in and zero. SmolLM2 eager
            # prefill, glibc's defaults -> these, ms (bench/prefill_levers.py --allocator, a process per run):
            # bfloat16 32x256 3563 -> 2881, 8x128 351 -> 324, 1x512 218 -> 203; float32 32x256 5487 -> 4679,
            # 8x128 777 -> 569, 1x512 335 -> 339.
            keep_freed_cpu_memory()
        self.sampler = Sampler()
        self.generator = torch.Generator(device=device).manual_seed(server_args.random_seed)
        self.load_model()
        self.init_memory_pool()
        self.attn_backend = TorchNativeAttnBackend()
        if device.type == "cpu" and self.model_config.dtype in KERNEL_DTYPES:
            decode_attention_op()  # the C++ kernels built or loaded now, not inside the first (timed) decode
        self.graph_runner: BaseRunner | None = self.init_decode_cuda_graph()

    def load_model(self) -> None:
        available = get_available_memory(self.device)
        sa = self.server_args
        self.model = get_model(self.model_config, sa.model_path, sa.load_format, self.device, sa.random_seed)
        if not sa.enable_torch_compile:
            prepack_linear_weights(self.model)
            prepack_lm_head(self.model.lm_head)
        else:  # compiled, Inductor's freezing packs the weights itself; the C++ kernel's copies not
            keep_blocked_copies(self.model)
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.available_after_load = min(available - self.weight_bytes, get_available_memory(self.device))

    def init_decode_cuda_graph(self) -> BaseRunner | None:
        """The runner of compiled or captured forwards: ``--enable-torch-compile``'s compiled model (any device),
        else on CUDA decode graphs captured now, unless ``--disable-cuda-graph``. SGLang's picks a graph runner per
        device and also measures the memory the graphs took."""
        if self.server_args.enable_torch_compile:
            return CPUGraphRunner(self)
        return DecodeCudaGraphRunner(self) if uses_cuda_graphs(self) else None

    def profile_max_num_token(self) -> int:
        """KV capacity in tokens: ``--max-total-tokens``, or a fraction of the memory left after the weights."""
        if self.server_args.max_total_tokens is not None:
            return self.server_args.max_total_tokens
        fraction = self.server_args.mem_fraction_static
        if fraction is None:
            fraction = 0.85 if self.device.type == "cuda" else 0.1
        cell_size = MHATokenToKVPool.get_cell_size_per_token(
            self.model_config.get_num_kv_heads(self.tp_size),
            self.model_config.head_dim,
            self.model_config.num_hidden_layers,
            self.model_config.dtype,
        )
        # req_to_token (int32, one row per request slot) comes out of the same budget.
        req_to_token_bytes = (_MAX_NUM_REQS + 1) * self.model_config.context_len * 4
        return int(self.available_after_load * fraction - req_to_token_bytes) // cell_size

    def init_memory_pool(self) -> None:
        self.max_total_num_tokens = self.profile_max_num_token()
        if self.max_total_num_tokens < 1:
            raise InputError(
                "no memory is left for the KV cache; raise --mem-fraction-static or set --max-total-tokens"
            )
        self.req_to_token_pool = ReqToTokenPool(
            min(_MAX_NUM_REQS, self.max_total_num_tokens), self.model_config.context_len, self.device
        )
        self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(self.max_total_num_tokens, self.device)
        self.token_to_kv_pool = MHATokenToKVPool(
            self.max_total_num_tokens,
            self.model_config.dtype,
            self.model_config.get_num_kv_heads(self.tp_size),
            self.model_config.head_dim,
            self.model_config.num_hidden_layers,
            self.device,
        )

    def forward(self, forward_batch: ForwardBatch) -> ModelRunnerOutput:
        """One model forward: the compiled or captured graph when there is one for this batch, else eager (as
        SGLang)."""
        if self.graph_runner is not None and self.graph_runner.can_run_graph(forward_batch):
            return ModelRunnerOutput(logits_output=self.graph_runner.execute(forward_batch))
        self.attn_backend.init_forward_metadata(forward_batch)
        logits_output = self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)
        return ModelRunnerOutput(logits_output=logits_output)

    def sample(self, logits_output: LogitsProcessorOutput, forward_batch: ForwardBatch) -> torch.Tensor:
        return self.sampler(logits_output, forward_batch.sampling_info, self.generator)
