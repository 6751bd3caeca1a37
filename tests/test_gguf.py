"""GGUF loading against transformers' own GGUF loader: every supported tensor type on a tiny llama
(q/k permutation included), and the real default model, SmolLM2-135M-Instruct (Q4_1 + Q8_0)."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from minisgl.model_loader.default_model import default_model_path
from minisgl.utils.hf_transformers_utils import get_config, get_tokenizer, gguf_metadata_dir
from tests.gguf_writer import write_llama_gguf
from tests.test_hf_equality import PROMPTS, make_runner, run_greedy

SGLANG_PROMPTS = ["The capital of France is", "The capital of the United Kindom is", "Today is a sunny day and I like"]


@pytest.fixture(scope="module")
def wide_llama(make_model):
    """Rows of 256 so that every block size (32 for Q8_0/Q4_x, 256 for Q6_K) divides them."""
    return make_model("llama", hidden_size=256, intermediate_size=512)


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q6_K"])
def test_gguf_types_match_transformers(wide_llama, tmp_path, qtype):
    gguf_file = tmp_path / f"tiny-{qtype}.gguf"
    write_llama_gguf(wide_llama, gguf_file, qtype)
    logits, _ = run_greedy(make_runner(gguf_file), PROMPTS, steps=1)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=gguf_file.name, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.stack([hf(torch.tensor([p])).logits[0, -1] for p in PROMPTS])
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)


def test_f32_gguf_equals_the_safetensors_it_came_from(wide_llama, tmp_path):
    """Undoing llama.cpp's q/k permutation restores the original weights exactly."""
    write_llama_gguf(wide_llama, tmp_path / "tiny.gguf", "F32")
    from_gguf, _ = run_greedy(make_runner(tmp_path / "tiny.gguf"), PROMPTS, steps=1)
    from_safetensors, _ = run_greedy(make_runner(wide_llama), PROMPTS, steps=1)
    torch.testing.assert_close(from_gguf, from_safetensors, atol=0, rtol=0)


@pytest.fixture(scope="module")
def smollm2():
    return default_model_path()


def test_smollm2_greedy_equals_transformers(smollm2):
    """SGLang's three correctness prompts: 16 greedy tokens identical to HF on the same GGUF."""
    tokenizer = get_tokenizer(smollm2)
    prompts = [tokenizer.encode(p) for p in SGLANG_PROMPTS]
    _, tokens = run_greedy(make_runner(smollm2, max_total_tokens=512), prompts, steps=16)
    directory, name = smollm2.rsplit("/", 1)
    hf = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32).eval()
    for prompt, ours in zip(prompts, tokens):
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=16, min_new_tokens=16, do_sample=False)
        assert ours == ref[0, len(prompt) :].tolist()
    assert tokenizer.decode(tokens[0]).startswith(" Paris")


def test_metadata_of_minisgl_fetched_gguf_is_parsed_once(wide_llama, tmp_path, monkeypatch):
    """Config and tokenizer of a GGUF in minisgl's cache (here a copy of the default model) are saved after
    the first parse and equal transformers' own parse; a GGUF elsewhere leaves nothing behind."""
    source = default_model_path()
    cache = tmp_path / "cache"
    monkeypatch.setenv("MINISGL_CACHE", str(cache))
    cache.mkdir()
    gguf_file = cache / "model.gguf"
    shutil.copyfile(source, gguf_file)
    get_config(str(gguf_file)), get_tokenizer(str(gguf_file))
    saved = gguf_metadata_dir(gguf_file)
    assert (saved / "config" / "config.json").exists() and (saved / "tokenizer").is_dir()
    assert sorted(p.name for p in saved.parent.iterdir()) == [saved.name]  # no temporary directory left

    # Zeros with the same size and mtime: only the saved copy can answer now.
    reference_config = AutoConfig.from_pretrained(cache, gguf_file=gguf_file.name).to_dict()
    reference_tokenizer = AutoTokenizer.from_pretrained(cache, gguf_file=gguf_file.name)
    stat = gguf_file.stat()
    with open(gguf_file, "r+b") as f:
        f.write(b"\0" * 4096)  # the header and the start of the metadata
    os.utime(gguf_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    config, tokenizer = get_config(str(gguf_file)), get_tokenizer(str(gguf_file))
    assert config.architectures == ["LlamaForCausalLM"]
    drop = {"architectures", "_name_or_path"}
    assert {k: v for k, v in config.to_dict().items() if k not in drop} == {
        k: v for k, v in reference_config.items() if k not in drop
    }
    for text in SGLANG_PROMPTS + ["<|im_start|>user\n  tabs\tand\nnewlines<|im_end|>"]:
        assert tokenizer(text).input_ids == reference_tokenizer(text).input_ids
    assert tokenizer.get_vocab() == reference_tokenizer.get_vocab()
    assert tokenizer.chat_template == reference_tokenizer.chat_template

    outside = tmp_path / "outside.gguf"
    write_llama_gguf(wide_llama, outside, "F32")
    assert gguf_metadata_dir(outside) is None
    get_config(str(outside))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "outside.gguf"]
