"""Checkpoint iterators: each yields ``(hf_name, tensor)`` one tensor at a time.

A rank never materialises the whole model: it reads one full tensor, its layer's ``weight_loader``
copies out this rank's shard, and the tensor is dropped. SGLang's ``weight_utils.py`` adds .bin/.pt,
npcache, multithreaded and remote loading, and quantized checkpoints.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from minisgl.utils.common import InputError


def safetensors_weights_iterator(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not files:
        raise InputError(f"no .safetensors files in {model_dir}; point --model-path at a HF checkpoint directory")
    for file in files:
        try:
            with safe_open(model_dir / file, framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        except (OSError, SafetensorError) as e:
            raise InputError(f"cannot read {model_dir / file} ({e}); the weights file is missing or corrupt") from None


# GGUF tensor names (llama.cpp) -> HF names; "{}" is the layer number.
_GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{}.attn_q.weight": "model.layers.{}.self_attn.q_proj.weight",
    "blk.{}.attn_k.weight": "model.layers.{}.self_attn.k_proj.weight",
    "blk.{}.attn_v.weight": "model.layers.{}.self_attn.v_proj.weight",
    "blk.{}.attn_output.weight": "model.layers.{}.self_attn.o_proj.weight",
    "blk.{}.ffn_gate.weight": "model.layers.{}.mlp.gate_proj.weight",
    "blk.{}.ffn_up.weight": "model.layers.{}.mlp.up_proj.weight",
    "blk.{}.ffn_down.weight": "model.layers.{}.mlp.down_proj.weight",
    "blk.{}.attn_norm.weight": "model.layers.{}.input_layernorm.weight",
    "blk.{}.ffn_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
}


def _gguf_to_hf_name(name: str) -> str:
    parts = name.split(".")
    if parts[0] == "blk":
        key, layer = ".".join(["blk", "{}", *parts[2:]]), parts[1]
        if key in _GGUF_TO_HF:
            return _GGUF_TO_HF[key].format(layer)
    elif name in _GGUF_TO_HF:
        return _GGUF_TO_HF[name]
    raise InputError(f"GGUF tensor {name!r} has no llama counterpart; only llama-architecture GGUF files load")


def _unpermute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved rope pairs) back to HF's half-split layout."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_quant_weights_iterator(gguf_file: Path, num_heads: int, num_kv_heads: int):
    import gguf  # imported here: only GGUF loading needs it

    try:
        reader = gguf.GGUFReader(gguf_file)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read GGUF file {gguf_file} ({e}); it is missing or corrupt") from None
    for tensor in reader.tensors:
        name = _gguf_to_hf_name(tensor.name)
        try:
            weights = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError:
            raise InputError(
                f"GGUF tensor type {tensor.tensor_type.name} is not supported by the gguf package"
            ) from None
        if name.endswith("q_proj.weight"):
            weights = _unpermute_rope(weights, num_heads)
        elif name.endswith("k_proj.weight"):
            weights = _unpermute_rope(weights, num_kv_heads)
        yield name, torch.from_numpy(np.array(weights, dtype=np.float32))  # a writable copy of the mmap


def dummy_weights_iterator(hf_config, seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Random weights for every tensor HF's own model would have, as SGLang's dummy loader draws them:
    uniform in [-1e-3, 1e-3], each tensor from its own seed (so every TP rank draws the same values).
    Norm weights are 1 so that activations keep a sensible scale through the layers."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        shapes = [(n, p.shape) for n, p in AutoModelForCausalLM.from_config(hf_config).state_dict().items()]
    for name, shape in shapes:
        if "norm" in name:
            yield name, torch.ones(shape, dtype=torch.float32)
            continue
        generator = torch.Generator().manual_seed(seed + zlib.crc32(name.encode()))
        yield name, torch.empty(shape, dtype=torch.float32).uniform_(-1e-3, 1e-3, generator=generator)
