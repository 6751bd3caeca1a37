"""Vocab-parallel embedding and LM head: each rank holds a contiguous block of vocabulary rows.

The embedding looks up only the ids in its block (zeros elsewhere) and all-reduces; the LM head
computes logits for its block and the logits processor all-gathers them. SGLang's version also pads
the vocabulary for LoRA and kernels, and supports quantized and org/added-vocab splits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from minisgl.layers.amx_utils import keep_blocked_copy, keep_float32_copy, prepack_weight
from minisgl.layers.linear import copy_checked, shard


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.tp_size = get_tensor_model_parallel_world_size()
        # Ceil-divide so any vocabulary size splits; the last rank's tail rows stay zero and unused.
        self.num_embeddings_per_partition = -(-num_embeddings // self.tp_size)
        self.vocab_start_index = get_tensor_model_parallel_rank() * self.num_embeddings_per_partition
        self.vocab_end_index = min(self.vocab_start_index + self.num_embeddings_per_partition, num_embeddings)
        self.weight = nn.Parameter(torch.zeros(self.num_embeddings_per_partition, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        # The LM head's matmul reads a prepacked copy when one is made (see ``prepack_weight``);
        # the lookup table itself stays plain.
        self.packed_weight: torch.Tensor | None = None

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        rows = self.vocab_end_index - self.vocab_start_index
        part = shard(loaded_weight, 0, 0, self.vocab_end_index, self.num_embeddings)[self.vocab_start_index :]
        copy_checked(param.data[:rows], part)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        in_range = (input_ids >= self.vocab_start_index) & (input_ids < self.vocab_end_index)
        local_ids = torch.where(in_range, input_ids - self.vocab_start_index, 0)
        out = F.embedding(local_ids, self.weight) * in_range.unsqueeze(-1).to(self.weight.dtype)
        return tensor_model_parallel_all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Same sharding as the embedding; its weight is read by ``LogitsProcessor``, not by ``forward``."""


def prepack_lm_head(lm_head: VocabParallelEmbedding) -> None:
    """An untied head keeps only the prepacked weight; a head tied to the embedding keeps both. A weight oneDNN
    cannot pack stays plain, with a float32 copy for batched rows where it is bfloat16 (``keep_float32_copy``)."""
    packed = prepack_weight(lm_head.weight)
    if packed is lm_head.weight:
        keep_float32_copy(lm_head.weight)  # a no-op but for bfloat16 on a CPU without bfloat16 arithmetic
        keep_blocked_copy(lm_head.weight, lm_head.weight)
        return
    keep_blocked_copy(packed, lm_head.weight)
    if isinstance(lm_head, ParallelLMHead):
        lm_head.weight = nn.Parameter(packed, requires_grad=False)
    lm_head.packed_weight = packed
