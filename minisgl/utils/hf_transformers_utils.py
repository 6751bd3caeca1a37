"""Config and tokenizer loading through transformers, for HF directories and GGUF files alike.

SGLang's ``hf_transformers_utils.py`` adds remote code, ModelScope, multimodal processors and many
tokenizer patches. A GGUF file carries its own config and tokenizer; transformers reads both.
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

from minisgl.utils.common import InputError

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


def get_config(model_path: str) -> PretrainedConfig:
    model_dir, gguf_file = split_model_path(model_path)
    try:
        config = AutoConfig.from_pretrained(model_dir, gguf_file=gguf_file)
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
    try:
        return AutoTokenizer.from_pretrained(tokenizer_dir, gguf_file=gguf_file)
    except (OSError, ValueError, KeyError) as e:
        raise InputError(f"cannot load a tokenizer from {tokenizer_path}: {str(e).splitlines()[0]}") from None
