"""ModelConfig: the architecture facts the runtime needs, read once from a Hugging Face config.

SGLang's ``ModelConfig`` (``sglang/srt/configs/model_config.py``) also handles multimodal, MLA, hybrid
(SWA/mamba) layouts, quantization configs and dozens of architecture quirks. minisgl reads the dense
decoder facts (heads, layers, context length, dtype) for Llama, Qwen2 and Qwen3.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from minisgl.utils.common import InputError

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}


def resolve_dtype(dtype: str, hf_config: PretrainedConfig, device: torch.device) -> torch.dtype:
    """``--dtype auto`` is float32 on CPU (exact and, at batch 1, as fast as bfloat16 here) and the
    checkpoint's half type on CUDA (bfloat16 when the checkpoint is float32), as SGLang does on GPUs."""
    if dtype != "auto":
        return _DTYPES[dtype]
    if device.type == "cpu":
        return torch.float32
    config_dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(config_dtype, str):
        config_dtype = _DTYPES.get(config_dtype)
    return config_dtype if config_dtype in (torch.bfloat16, torch.float16) else torch.bfloat16


@dataclass(frozen=True)
class ModelConfig:
    hf_config: PretrainedConfig
    architecture: str
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_hidden_layers: int
    vocab_size: int
    context_len: int
    dtype: torch.dtype

    @classmethod
    def from_hf_config(cls, hf_config: PretrainedConfig, dtype: torch.dtype) -> ModelConfig:
        architectures = getattr(hf_config, "architectures", None) or []
        if not architectures:
            raise InputError("the model config names no architecture; set 'architectures' in config.json")
        heads = hf_config.num_attention_heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
        return cls(
            hf_config=hf_config,
            architecture=architectures[0],
            hidden_size=hf_config.hidden_size,
            num_attention_heads=heads,
            num_key_value_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            num_hidden_layers=hf_config.num_hidden_layers,
            vocab_size=hf_config.vocab_size,
            context_len=hf_config.max_position_embeddings,
            dtype=dtype,
        )

    def get_num_kv_heads(self, tp_size: int) -> int:
        """KV heads held by one tensor-parallel rank: replicated when there are fewer than ranks."""
        return max(1, self.num_key_value_heads // tp_size)
