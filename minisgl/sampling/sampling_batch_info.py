"""SamplingBatchInfo: a batch's sampling parameters as tensors, one row per request.

Built once per batch (in ``prepare_for_extend``) so that requests with different temperatures, top-k,
top-p and min-p share one sampling call. SGLang's version also holds penalizers, grammar vocab masks,
logit bias and custom logit processors, and is filtered/merged as requests leave and join.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from minisgl.sampling.sampling_params import TOP_K_ALL

if TYPE_CHECKING:
    from minisgl.managers.schedule_batch import ScheduleBatch


@dataclass
class SamplingBatchInfo:
    temperatures: torch.Tensor  # [batch, 1]
    top_ps: torch.Tensor  # [batch]
    top_ks: torch.Tensor  # [batch], int32
    min_ps: torch.Tensor  # [batch]
    is_all_greedy: bool
    need_top_p_sampling: bool
    need_top_k_sampling: bool
    need_min_p_sampling: bool
    vocab_size: int

    @classmethod
    def from_schedule_batch(cls, batch: ScheduleBatch, vocab_size: int) -> SamplingBatchInfo:
        params = [req.sampling_params for req in batch.reqs]
        device = batch.device
        top_ks = [p.top_k for p in params]
        return cls(
            temperatures=torch.tensor([[p.temperature] for p in params], dtype=torch.float32, device=device),
            top_ps=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            top_ks=torch.tensor([min(k, TOP_K_ALL) for k in top_ks], dtype=torch.int32, device=device),
            min_ps=torch.tensor([p.min_p for p in params], dtype=torch.float32, device=device),
            is_all_greedy=all(k <= 1 for k in top_ks),
            need_top_p_sampling=any(p.top_p != 1.0 for p in params),
            need_top_k_sampling=any(k != TOP_K_ALL for k in top_ks),
            need_min_p_sampling=any(p.min_p > 0 for p in params),
            vocab_size=vocab_size,
        )
