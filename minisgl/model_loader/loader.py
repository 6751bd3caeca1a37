"""Model loaders: build the model for this rank, then stream the checkpoint into it.

``get_model`` picks the loader from ``--load-format`` (SGLang's ``get_model_loader``): safetensors
directories, llama-architecture GGUF files (dequantized to the runtime dtype), or dummy weights.
SGLang's ``loader.py`` adds sharded-state, bitsandbytes, layered, remote and quantized loaders.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch import nn

from minisgl.configs.model_config import ModelConfig
from minisgl.model_loader import weight_utils
from minisgl.models.registry import get_model_class
from minisgl.utils.common import InputError
from minisgl.utils.hf_transformers_utils import split_model_path


@contextlib.contextmanager
def set_default_torch_dtype(dtype: torch.dtype):
    """Parameters are created directly in the runtime dtype, never as float32 copies first."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def resolve_load_format(load_format: str, model_path: str) -> str:
    _, gguf_file = split_model_path(model_path)
    if load_format == "auto":
        return "gguf" if gguf_file else "safetensors"
    if (load_format == "gguf") != bool(gguf_file) and load_format != "dummy":
        raise InputError(f"--load-format {load_format} does not match {model_path}; use --load-format auto")
    return load_format


def get_model(
    model_config: ModelConfig, model_path: str, load_format: str, device: torch.device, seed: int
) -> nn.Module:
    model_cls = get_model_class(model_config.architecture)
    with set_default_torch_dtype(model_config.dtype), torch.device(device):
        model = model_cls(model_config.hf_config)
    load_format = resolve_load_format(load_format, model_path)
    model_dir, gguf_file = split_model_path(model_path)
    if load_format == "dummy":
        weights = weight_utils.dummy_weights_iterator(model_config.hf_config, seed)
    elif load_format == "gguf":
        weights = weight_utils.gguf_quant_weights_iterator(
            Path(model_dir, gguf_file), model_config.num_attention_heads, model_config.num_key_value_heads
        )
    else:
        weights = weight_utils.safetensors_weights_iterator(Path(model_dir))
    model.load_weights(weights)
    return model.eval()
