"""Shared fixtures: tiny random Llama / Qwen2 / Qwen3 checkpoints with a locally trained tokenizer.

Everything is built offline from transformers config classes with fixed seeds, saved as safetensors
(exactly what a user's HF directory holds) and cached for the whole test session.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from tests.tiny_models import build_tiny_model, train_tokenizer  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """``MINISGL_TEST_DEVICE`` (bench/cuda.sh) moves tests/test_hf_equality.py and tests/test_cuda_graph.py to another
    device; the other modules are written for CPU (some import its helpers), so there they are skipped rather than
    run half on the GPU."""
    device = os.environ.get("MINISGL_TEST_DEVICE", "cpu")
    if device == "cpu":
        return
    skip = pytest.mark.skip(reason=f"MINISGL_TEST_DEVICE={device} runs the HF-equality and CUDA-graph tests only")
    for item in items:
        if item.path.name not in ("test_hf_equality.py", "test_cuda_graph.py"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    return train_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def make_model(tmp_path_factory, tokenizer_dir):
    """``make_model(arch, **config_overrides)`` -> path of a saved tiny checkpoint (cached per arguments)."""
    cache = {}

    def make(arch: str, **overrides):
        key = (arch, repr(sorted(overrides.items())))
        if key not in cache:
            cache[key] = build_tiny_model(tmp_path_factory.mktemp(arch), tokenizer_dir, arch, **overrides)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_llama(make_model):
    """GQA (4 query heads, 2 KV heads), untied LM head."""
    return make_model("llama")


@pytest.fixture(scope="session")
def tiny_qwen2(make_model):
    """qkv bias, tied embeddings."""
    return make_model("qwen2", tie_word_embeddings=True)


@pytest.fixture(scope="session")
def tiny_qwen3(make_model):
    """Per-head q/k norm, an odd head_dim (24, not hidden/heads), GQA."""
    return make_model("qwen3", head_dim=24)
