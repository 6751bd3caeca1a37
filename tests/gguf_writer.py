"""Write a HF llama checkpoint as a llama-architecture GGUF file, the way llama.cpp's converter does
(q/k rows permuted for its rope kernel), with one chosen tensor type for the 2-D weights."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoConfig

_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}  # fmt: skip


def _gguf_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, layer, *rest = hf_name.split(".")
    return f"blk.{layer}.{_NAMES['.'.join(rest[:-1])]}.weight"


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_q6_k(rows: int, cols: int, seed: int) -> np.ndarray:
    """Random but valid Q6_K blocks (gguf-py cannot quantize to Q6_K): random quants, sane f16 scales."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows, cols // 256, 210), dtype=np.uint8)
    blocks[..., 192:208] = rng.integers(-8, 8, size=(rows, cols // 256, 16)).astype(np.int8).view(np.uint8)
    blocks[..., 208:210] = np.full((rows, cols // 256), 1e-3, dtype=np.float16)[..., None].view(np.uint8)
    return blocks.reshape(rows, -1)


def write_llama_gguf(model_dir: Path, out_file: Path, qtype: str) -> None:
    config = AutoConfig.from_pretrained(model_dir)
    writer = gguf.GGUFWriter(str(out_file), "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    kind = gguf.GGMLQuantizationType[qtype]
    for i, (name, tensor) in enumerate(sorted(load_file(model_dir / "model.safetensors").items())):
        w = tensor.to(torch.float32).numpy()
        if name.endswith("q_proj.weight"):
            w = _permute(w, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            w = _permute(w, config.num_key_value_heads)
        if w.ndim == 1 or qtype == "F32":
            writer.add_tensor(_gguf_name(name), w)
        elif qtype == "Q6_K":
            writer.add_tensor(_gguf_name(name), random_q6_k(*w.shape, seed=i), raw_dtype=kind)
        else:
            writer.add_tensor(_gguf_name(name), gguf.quants.quantize(w, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
