"""Builders for tiny offline checkpoints (used by conftest and by the bench tests' subprocesses)."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen3Config

CONFIGS = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}
ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

CORPUS = [
    "The capital of France is Paris. The capital of the United Kingdom is London.",
    "Today is a sunny day and I like to go for a walk in the park with my friends.",
    "A serving runtime batches requests, keeps their keys and values in a cache and samples tokens.",
] * 20


def train_tokenizer(out_dir: Path, vocab_size: int = 384) -> Path:
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tk.train_from_iterator(CORPUS, trainer)
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    tok.save_pretrained(out_dir)
    return Path(out_dir)


def tiny_config(arch: str, vocab_size: int, **overrides):
    kwargs = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, architectures=[ARCHS[arch]],
    )  # fmt: skip
    kwargs.update(overrides)
    return CONFIGS[arch](**kwargs)


def build_tiny_model(out_dir: Path, tokenizer_dir: Path, arch: str, seed: int = 0, **overrides) -> Path:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    config = tiny_config(arch, len(tokenizer), **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    # Scale weights up so logits are far from ties: greedy tokens then compare meaningfully against HF.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.15)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return Path(out_dir)
