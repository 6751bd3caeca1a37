"""ForwardMode and ForwardBatch: what one model forward needs, as device tensors.

``ScheduleBatch`` is the scheduler's view (Python lists, requests); ``ForwardBatch`` is the model's view:
flat ``input_ids``, ``positions``, where each request's new tokens start, where their K/V go, and handles
to the pools and the attention backend. SGLang's ``forward_batch_info.py`` also carries logprob,
multimodal (mrope), LoRA, speculative, DP-attention padding and two-batch-overlap fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, auto
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from minisgl.layers.attention.base_attn_backend import AttentionBackend
    from minisgl.managers.schedule_batch import ScheduleBatch
    from minisgl.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from minisgl.model_executor.model_runner import ModelRunner
    from minisgl.sampling.sampling_batch_info import SamplingBatchInfo


class ForwardMode(IntEnum):
    """EXTEND: compute new tokens after a (possibly empty) cached prefix; DECODE: one token per request.

    SGLang also has MIXED, IDLE, TARGET_VERIFY, DRAFT_EXTEND, SPLIT_PREFILL and DLLM_EXTEND.
    """

    EXTEND = auto()
    DECODE = auto()

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    out_cache_loc: torch.Tensor
    positions: torch.Tensor
    sampling_info: SamplingBatchInfo
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: MHATokenToKVPool
    attn_backend: AttentionBackend
    extend_num_tokens: int | None = None
    extend_seq_lens: torch.Tensor | None = None
    extend_prefix_lens: torch.Tensor | None = None
    extend_start_loc: torch.Tensor | None = None
    extend_seq_lens_cpu: list[int] | None = None
    extend_prefix_lens_cpu: list[int] | None = None

    @classmethod
    def init_new(cls, batch: ScheduleBatch, model_runner: ModelRunner) -> ForwardBatch:
        device = model_runner.device
        ret = cls(
            forward_mode=batch.forward_mode,
            batch_size=len(batch.reqs),
            input_ids=batch.input_ids,
            req_pool_indices=batch.req_pool_indices,
            seq_lens=batch.seq_lens,
            seq_lens_cpu=batch.seq_lens_cpu,
            out_cache_loc=batch.out_cache_loc,
            positions=clamp_position(batch.seq_lens),
            sampling_info=batch.sampling_info,
            req_to_token_pool=model_runner.req_to_token_pool,
            token_to_kv_pool=model_runner.token_to_kv_pool,
            attn_backend=model_runner.attn_backend,
        )
        if ret.forward_mode.is_extend():
            ret.extend_num_tokens = batch.extend_num_tokens
            ret.extend_seq_lens_cpu = batch.extend_lens
            ret.extend_prefix_lens_cpu = batch.prefix_lens
            ret.extend_seq_lens = torch.tensor(batch.extend_lens, dtype=torch.int32, device=device)
            ret.extend_prefix_lens = torch.tensor(batch.prefix_lens, dtype=torch.int32, device=device)
            ret.positions, ret.extend_start_loc = compute_position(ret.extend_prefix_lens, ret.extend_seq_lens)
        return ret


def compute_position(extend_prefix_lens: torch.Tensor, extend_seq_lens: torch.Tensor):
    """Positions ``prefix_len .. seq_len-1`` of each request, flattened, and where each request starts.

    Built without a Python loop: each token's position is its index in the flat batch minus its request's
    start, plus that request's prefix length.
    """
    extend_start_loc = torch.cumsum(extend_seq_lens, dim=0) - extend_seq_lens
    offsets = (extend_prefix_lens - extend_start_loc).repeat_interleave(extend_seq_lens)
    token_index = torch.arange(offsets.numel(), device=offsets.device)
    return (token_index + offsets).to(torch.int64), extend_start_loc


def clamp_position(seq_lens: torch.Tensor) -> torch.Tensor:
    """Decode position: ``seq_lens`` already counts the new token, so it sits at ``seq_len - 1``."""
    return torch.clamp(seq_lens - 1, min=0).to(torch.int64)
