"""ModelRegistry: architecture name (``config.architectures[0]``) to model class.

SGLang's registry imports every module in ``sglang.srt.models`` and collects their ``EntryClass``;
minisgl lists its three modules.
"""

from __future__ import annotations

from torch import nn

from minisgl.models import llama, qwen2, qwen3
from minisgl.utils.common import InputError

ModelRegistry: dict[str, type[nn.Module]] = {
    cls.__name__: cls for module in (llama, qwen2, qwen3) for cls in module.EntryClass
}


def get_model_class(architecture: str) -> type[nn.Module]:
    if architecture not in ModelRegistry:
        raise InputError(
            f"architecture {architecture!r} is not supported; minisgl runs {', '.join(sorted(ModelRegistry))}"
        )
    return ModelRegistry[architecture]
