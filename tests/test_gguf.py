"""GGUF loading against transformers' own GGUF loader: every supported tensor type on a tiny llama
(q/k permutation included), and the real default model, SmolLM2-135M-Instruct (Q4_1 + Q8_0)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from minisgl.model_loader.default_model import default_model_path
from minisgl.utils.hf_transformers_utils import get_tokenizer
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
