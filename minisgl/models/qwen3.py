"""Qwen3: the Llama decoder plus a per-head RMSNorm on q and k, applied before RoPE (no qkv bias).

SGLang's ``qwen3.py`` builds on its Qwen2 classes and routes layers through a ``LayerCommunicator``
for DP attention; the math is the same.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from minisgl.layers.layernorm import RMSNorm
from minisgl.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel


class Qwen3Attention(LlamaAttention):
    def __init__(self, config: PretrainedConfig, layer_id: int, qkv_bias: bool):
        super().__init__(config, layer_id, qkv_bias)
        self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def apply_qk_norm(self, q, k):
        return self.q_norm(q), self.k_norm(k)


class Qwen3DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3Attention


class Qwen3Model(LlamaModel):
    layer_cls = Qwen3DecoderLayer


class Qwen3ForCausalLM(LlamaForCausalLM):
    model_cls = Qwen3Model


EntryClass = [Qwen3ForCausalLM]
