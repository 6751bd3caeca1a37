"""AttentionBackend: the small interface every attention implementation provides.

``init_forward_metadata`` runs once per forward (not per layer) to turn the batch into whatever index
tensors the kernels want (``init_forward_metadata_out_graph`` before a compiled forward); ``forward_extend`` /
``forward_decode`` write the new K/V into the pool and attend. SGLang's base class splits the metadata into an
``_out_graph`` part (host work before a graph replay) and an ``_in_graph`` part (recorded into CUDA graphs) and
adds capture/replay hooks, mixed and idle modes, and speculative-decoding verify paths.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from minisgl.layers.radix_attention import RadixAttention
    from minisgl.model_executor.forward_batch_info import ForwardBatch


class AttentionBackend(ABC):
    @abstractmethod
    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None: ...

    @abstractmethod
    def init_forward_metadata_out_graph(self, forward_batch: ForwardBatch) -> None:
        """The metadata for a compiled forward (``CPUGraphRunner``), built outside the graph before it runs."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: RadixAttention, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        if forward_batch.forward_mode.is_decode():
            return self.forward_decode(q, k, v, layer, forward_batch)
        return self.forward_extend(q, k, v, layer, forward_batch)

    @abstractmethod
    def forward_extend(self, q, k, v, layer: RadixAttention, forward_batch: ForwardBatch) -> torch.Tensor: ...

    @abstractmethod
    def forward_decode(self, q, k, v, layer: RadixAttention, forward_batch: ForwardBatch) -> torch.Tensor: ...
