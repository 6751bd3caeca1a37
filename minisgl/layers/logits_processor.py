"""LogitsProcessor: the LM head applied only where a next token is needed.

In extend mode only each request's last position is sampled from, so hidden states are pruned to those
rows *before* the vocabulary-sized matmul (for a 512-token prompt that is 512x less LM-head work).
SGLang's version also computes input-token logprobs, hidden-state capture and logit soft-capping.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from minisgl.distributed.parallel_state import tensor_model_parallel_all_gather
from minisgl.layers.amx_utils import apply_linear
from minisgl.model_executor.forward_batch_info import ForwardBatch


@dataclass
class LogitsProcessorOutput:
    next_token_logits: torch.Tensor  # [batch, vocab], float32


class LogitsProcessor(nn.Module):
    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, hidden_states: torch.Tensor, lm_head: nn.Module, forward_batch: ForwardBatch):
        if forward_batch.forward_mode.is_extend():
            last_index = forward_batch.extend_start_loc + forward_batch.extend_seq_lens - 1
            hidden_states = hidden_states[last_index]
        weight = lm_head.packed_weight if lm_head.packed_weight is not None else lm_head.weight
        logits = tensor_model_parallel_all_gather(apply_linear(hidden_states, weight))
        return LogitsProcessorOutput(next_token_logits=logits[:, : self.vocab_size].float())
