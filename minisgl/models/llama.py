"""Llama (2, 3, 3.1 with llama3 rope scaling, SmolLM2, Mistral without sliding window).

The decoder is SGLang's: fused ``qkv_proj`` and ``gate_up_proj`` (one GEMM instead of three and two),
RMSNorm with the residual add fused in, attention through ``RadixAttention`` and the pools, logits
only at sampled positions. Checkpoint names (``q_proj``, ``gate_proj``, ...) are mapped onto the fused
parameters by ``load_weights`` with SGLang's ``stacked_params_mapping``. SGLang's ``llama.py`` adds
quantization, pipeline parallelism, EAGLE hidden-state capture and embedding/classification heads.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from transformers import PretrainedConfig

from minisgl.distributed.parallel_state import get_tensor_model_parallel_world_size
from minisgl.layers.activation import SiluAndMul
from minisgl.layers.layernorm import RMSNorm
from minisgl.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    default_weight_loader,
)
from minisgl.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from minisgl.layers.radix_attention import RadixAttention
from minisgl.layers.rotary_embedding import get_rope
from minisgl.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from minisgl.model_executor.forward_batch_info import ForwardBatch
from minisgl.utils.common import InputError

# gate_up output per block of a long CPU prefill's rows: with the SiLU product, inside a 32 MiB L3.
_MLP_BLOCK_BYTES = 16 << 20
# Blocks of a long prefill inside a compiled graph: a fixed count keeps one graph for every length, where a count
# that follows the length would recompile at each new count.
_COMPILED_MLP_BLOCKS = 8


class LlamaMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size)
        self.act_fn = SiluAndMul()
        self.gate_up_size = 2 * intermediate_size // get_tensor_model_parallel_world_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        block_rows = max(1, _MLP_BLOCK_BYTES // (self.gate_up_size * x.element_size()))
        if x.shape[0] <= block_rows or x.device.type != "cpu":
            return self.down_proj(self.act_fn(self.gate_up_proj(x)))
        # Block by block, the MLP's widest activations stay in cache between the GEMM that writes them and the
        # one that reads them, instead of going out to memory and back. 32x256 prefill on an AMD EPYC, in-process
        # A/B, ms (two runs where given). Eager: SmolLM2 float32 6015 -> 5461, 7036 -> 5889; bfloat16
        # 3468 -> 3429, 3554 -> 3245; dummy134 float32 4751 -> 4488, bfloat16 2874 -> 2514. Compiled, 8 blocks:
        # SmolLM2 float32 6276 -> 4883, bfloat16 3151 -> 2979; dummy134 bfloat16 2253 -> 2010. SGLang bounds a
        # whole prefill's size instead, with --chunked-prefill-size.
        if torch.compiler.is_compiling():
            # Sizes written out: tensor_split's would guard on the length modulo the count (a graph per remainder).
            size = x.shape[0] // _COMPILED_MLP_BLOCKS
            blocks = x.split([size] * (_COMPILED_MLP_BLOCKS - 1) + [x.shape[0] - size * (_COMPILED_MLP_BLOCKS - 1)])
        else:
            blocks = x.tensor_split(-(-x.shape[0] // block_rows))
        return torch.cat([self.down_proj(self.act_fn(self.gate_up_proj(block))) for block in blocks])


class LlamaAttention(nn.Module):
    def __init__(self, config: PretrainedConfig, layer_id: int, qkv_bias: bool):
        super().__init__()
        tp_size = get_tensor_model_parallel_world_size()
        self.total_num_heads = config.num_attention_heads
        self.total_num_kv_heads = getattr(config, "num_key_value_heads", None) or self.total_num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.total_num_heads
        self.num_heads = self.total_num_heads // tp_size
        self.num_kv_heads = max(1, self.total_num_kv_heads // tp_size)
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, self.head_dim, self.total_num_heads, self.total_num_kv_heads, bias=qkv_bias
        )
        self.o_proj = RowParallelLinear(self.total_num_heads * self.head_dim, config.hidden_size)
        self.rotary_emb = get_rope(config, self.head_dim, config.max_position_embeddings)
        self.attn = RadixAttention(self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads, layer_id)

    def apply_qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k  # Qwen3 normalises each head here, before RoPE

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch: ForwardBatch):
        q, k, v = self.qkv_proj(hidden_states).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        q, k = self.rotary_emb(positions, *self.apply_qk_norm(q, k))
        return self.o_proj(self.attn(q, k, v, forward_batch))


class LlamaDecoderLayer(nn.Module):
    attention_cls = LlamaAttention

    def __init__(self, config: PretrainedConfig, layer_id: int, qkv_bias: bool):
        super().__init__()
        self.self_attn = self.attention_cls(config, layer_id, qkv_bias)
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions, hidden_states, forward_batch: ForwardBatch, residual: torch.Tensor | None):
        if residual is None:
            residual, hidden_states = hidden_states, self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, forward_batch)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class LlamaModel(nn.Module):
    layer_cls = LlamaDecoderLayer

    def __init__(self, config: PretrainedConfig, qkv_bias: bool):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(self.layer_cls(config, i, qkv_bias) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch):
        hidden_states, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, forward_batch, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(nn.Module):
    model_cls = LlamaModel
    # (fused parameter, checkpoint name, shard id): q/k/v go into qkv_proj, gate/up into gate_up_proj.
    stacked_params_mapping = [
        (".qkv_proj", ".q_proj", "q"),
        (".qkv_proj", ".k_proj", "k"),
        (".qkv_proj", ".v_proj", "v"),
        (".gate_up_proj", ".gate_proj", 0),
        (".gate_up_proj", ".up_proj", 1),
    ]

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.config = config
        self.model = self.model_cls(config, qkv_bias=self.qkv_bias(config))
        if config.tie_word_embeddings:
            self.lm_head = self.model.embed_tokens
        else:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        self.logits_processor = LogitsProcessor(config.vocab_size)

    @staticmethod
    def qkv_bias(config: PretrainedConfig) -> bool:
        return bool(getattr(config, "attention_bias", False))

    @torch.no_grad()
    def forward(self, input_ids, positions, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        hidden_states = self.model(input_ids, positions, forward_batch)
        return self.logits_processor(hidden_states, self.lm_head, forward_batch)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors (HF names) into this rank's parameters; every parameter must be filled."""
        params = dict(self.named_parameters())
        loaded = set()
        for name, loaded_weight in weights:
            if "rotary_emb" in name or (self.config.tie_word_embeddings and name == "lm_head.weight"):
                continue
            for param_name, weight_name, shard_id in self.stacked_params_mapping:
                if weight_name in name:
                    name = name.replace(weight_name, param_name)
                    if name in params:
                        params[name].weight_loader(params[name], loaded_weight, shard_id)
                    break
            else:
                if name in params:
                    getattr(params[name], "weight_loader", default_weight_loader)(params[name], loaded_weight)
            loaded.add(name)
        missing = sorted(set(params) - loaded)
        if missing:
            raise InputError(f"the checkpoint lacks {len(missing)} weights (first: {missing[0]}); it is incomplete")


class MistralForCausalLM(LlamaForCausalLM):
    def __init__(self, config: PretrainedConfig):
        window = getattr(config, "sliding_window", None)
        if window is not None and window < config.max_position_embeddings:
            raise InputError(f"Mistral with sliding_window={window} is not supported; minisgl has full attention only")
        super().__init__(config)


EntryClass = [LlamaForCausalLM, MistralForCausalLM]
