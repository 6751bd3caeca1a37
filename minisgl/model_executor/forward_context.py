"""ForwardContext: the batch of the forward now running, for code that cannot be handed it as an argument.

Under ``torch.compile`` the attention of a multi-request extend is an opaque custom op
(``minisgl::unified_attention``) whose arguments must be tensors and numbers; it finds the ``ForwardBatch``
(pools, backend metadata) and its ``RadixAttention`` layer here instead. The graph runner publishes a
context around each compiled call. SGLang's ``forward_context.py`` holds the attention backend for every
forward, and its piecewise-CUDA-graph context carries the forward batch and attention layers the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minisgl.layers.radix_attention import RadixAttention
    from minisgl.model_executor.forward_batch_info import ForwardBatch


@dataclass(frozen=True)
class ForwardContext:
    forward_batch: ForwardBatch
    attention_layers: list[RadixAttention]  # indexed by layer_id


_current: ForwardContext | None = None


def get_forward_context() -> ForwardContext:
    if _current is None:
        raise RuntimeError("no forward context is active: run the compiled model inside forward_context(...)")
    return _current


@contextmanager
def forward_context(ctx: ForwardContext) -> Iterator[None]:
    global _current
    previous, _current = _current, ctx
    try:
        yield
    finally:
        _current = previous
