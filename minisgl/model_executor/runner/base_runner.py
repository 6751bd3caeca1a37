"""BaseRunner: what ``ModelRunner.forward`` asks of a runner of compiled or captured forwards.

``can_run_graph(forward_batch)`` says whether this batch runs there; ``execute(forward_batch)`` runs it and returns
the logits. minisgl has two: ``CPUGraphRunner`` (``--enable-torch-compile``, any device) and
``DecodeCudaGraphRunner`` (CUDA graphs). SGLang's ``BaseRunner`` is also the base of its ``EagerRunner`` and of the
prefill graph runner, asks for ``load_batch`` too, and warms up and autotunes FlashInfer's kernels with dummy runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minisgl.layers.logits_processor import LogitsProcessorOutput
    from minisgl.model_executor.forward_batch_info import ForwardBatch


class BaseRunner(ABC):
    @abstractmethod
    def can_run_graph(self, forward_batch: ForwardBatch) -> bool: ...

    @abstractmethod
    def execute(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput: ...
