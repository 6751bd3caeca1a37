"""Config and tokenizer loading through transformers, for HF directories and GGUF files alike.

SGLang's ``hf_transformers_utils.py`` adds remote code, ModelScope, multimodal processors and many
tokenizer patches. A GGUF file carries its own config and tokenizer; transformers reads both.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import transformers
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

from minisgl.utils.common import InputError, cache_dir

# A GGUF config carries the model type but no architecture name.
_ARCH_BY_MODEL_TYPE = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def split_model_path(model_path: str, need_config: bool = True) -> tuple[Path, str | None]:
    """``(directory, gguf_file_name or None)`` for a model directory or a ``.gguf`` file."""
    path = Path(model_path).expanduser()
    if not path.exists():
        raise InputError(f"model path {model_path} does not exist; pass a HF directory or a .gguf file")
    if path.is_file():
        if path.suffix != ".gguf":
            raise InputError(f"{model_path} is a file but not .gguf; pass a HF directory or a .gguf file")
        return path.parent, path.name
    if need_config and not (path / "config.json").exists():
        raise InputError(f"{model_path} has no config.json; it is not a HF model directory")
    return path, None


def gguf_metadata_dir(gguf: Path) -> Path | None:
    """Where the config and tokenizer parsed from a GGUF that minisgl fetched itself are kept, or None.

    transformers parses the whole GGUF metadata, vocabulary included, for the config and again for the
    tokenizer (~3.5 s each for SmolLM2, and the bench reads the config twice). For files in minisgl's own
    cache (the default model) the results are saved once, keyed by the file's size and mtime and by the
    transformers version; other GGUFs are parsed as transformers does, leaving nothing beside them.
    """
    gguf = gguf.resolve()
    if not gguf.is_relative_to(cache_dir().resolve()):
        return None
    stat = gguf.stat()
    key = f"{gguf.stem}-{stat.st_size}-{stat.st_mtime_ns}-transformers{transformers.__version__}"
    return cache_dir() / "gguf-metadata" / key


def _load_cached(target: Path | None, load: Callable[[Path | None], object], save_to: Callable[[object, str], None]):
    """``load(target)`` when a saved copy exists, else ``load(None)`` (the GGUF) and save it for next time.

    Saved into a temporary directory and renamed, so an interrupted run never leaves a half-written copy;
    a cache that cannot be written only costs the parse next time.
    """
    if target is not None and target.exists():
        return load(target)
    loaded = load(None)
    if target is not None:
        tmp = None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = tempfile.mkdtemp(dir=target.parent)
            save_to(loaded, tmp)
            os.replace(tmp, target)
        except OSError:  # another process won the rename, a read-only cache, no space
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
    return loaded


def get_config(model_path: str) -> PretrainedConfig:
    model_dir, gguf_file = split_model_path(model_path)
    cached = gguf_metadata_dir(model_dir / gguf_file) if gguf_file else None
    try:
        config = _load_cached(
            cached and cached / "config",
            lambda saved: AutoConfig.from_pretrained(saved or model_dir, gguf_file=None if saved else gguf_file),
            lambda config, directory: config.save_pretrained(directory),
        )
    except (OSError, ValueError, KeyError) as e:
        raise InputError(f"cannot read the model config at {model_path}: {str(e).splitlines()[0]}") from None
    if not getattr(config, "architectures", None):
        arch = _ARCH_BY_MODEL_TYPE.get(config.model_type)
        if arch is None:
            raise InputError(f"model type {config.model_type!r} is not supported; minisgl runs llama, qwen2, qwen3")
        config.architectures = [arch]
    return config


def get_tokenizer(tokenizer_path: str) -> PreTrainedTokenizerBase:
    tokenizer_dir, gguf_file = split_model_path(tokenizer_path, need_config=False)
    cached = gguf_metadata_dir(tokenizer_dir / gguf_file) if gguf_file else None
    try:
        return _load_cached(
            cached and cached / "tokenizer",
            lambda saved: AutoTokenizer.from_pretrained(saved or tokenizer_dir, gguf_file=None if saved else gguf_file),
            lambda tokenizer, directory: tokenizer.save_pretrained(directory),
        )
    except (OSError, ValueError, KeyError) as e:
        raise InputError(f"cannot load a tokenizer from {tokenizer_path}: {str(e).splitlines()[0]}") from None
