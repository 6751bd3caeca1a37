"""Req and ScheduleBatch: the scheduler's view of requests and of one batch of them.

A ``Req`` is token bookkeeping: its prompt, what it has generated, which tokens the next forward must
compute (``fill_len`` minus the cached ``prefix_indices``) and its row in ``req_to_token``.
A ``ScheduleBatch`` turns a list of them into flat tensors: ``prepare_for_extend`` for a prefill (or an
extend on a cached prefix) and ``prepare_for_decode`` for one new token per request.

SGLang's ``schedule_batch.py`` adds chunked prefill, radix-cache locking, retraction, filtering and
merging of running batches, logprobs, multimodal inputs, speculative decoding, disaggregation and
overlap scheduling, in about 4,000 lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from minisgl.configs.model_config import ModelConfig
from minisgl.mem_cache.allocator import TokenToKVPoolAllocator
from minisgl.mem_cache.common import alloc_for_decode, alloc_for_extend
from minisgl.mem_cache.memory_pool import ReqToTokenPool
from minisgl.model_executor.forward_batch_info import ForwardMode
from minisgl.sampling.sampling_batch_info import SamplingBatchInfo
from minisgl.sampling.sampling_params import SamplingParams


class Req:
    """One request's token state. ``fill_len`` tokens of ``full_untruncated_fill_ids`` are to be in the
    KV cache after the next extend; the first ``len(prefix_indices)`` of them already are."""

    def __init__(self, rid, origin_input_text: str, origin_input_ids: Sequence[int], sampling_params: SamplingParams):
        self.rid = rid
        self.origin_input_text = origin_input_text
        self.origin_input_ids: list[int] = list(origin_input_ids)
        self.output_ids: list[int] = []
        self.sampling_params = sampling_params
        self.full_untruncated_fill_ids: list[int] = []
        self.fill_len = 0
        self.prefix_indices = torch.empty(0, dtype=torch.int64)  # KV slots of the cached prefix
        self.extend_input_len = 0
        self.req_pool_idx: int | None = None
        # SGLang's Req.check_finished sets it (length, EOS, stop strings); the bench never ends a request early.
        self.finished_reason = None

    def get_fill_ids(self) -> list[int]:
        return self.full_untruncated_fill_ids[: self.fill_len]

    def set_extend_input_len(self, extend_input_len: int) -> None:
        self.extend_input_len = extend_input_len


@dataclass
class ScheduleBatch:
    reqs: list[Req]
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool_allocator: TokenToKVPoolAllocator
    model_config: ModelConfig
    device: torch.device
    forward_mode: ForwardMode | None = None
    input_ids: torch.Tensor | None = None  # [tokens to compute], flat over the batch
    req_pool_indices: torch.Tensor | None = None  # [batch] rows in req_to_token
    seq_lens: torch.Tensor | None = None  # [batch] tokens in the KV cache after this forward
    seq_lens_cpu: torch.Tensor | None = None  # host copy, so shapes never need a device sync
    out_cache_loc: torch.Tensor | None = None  # [tokens to compute] KV slots they are written to
    prefix_lens: list[int] = field(default_factory=list)
    extend_lens: list[int] = field(default_factory=list)
    extend_num_tokens: int = 0
    sampling_info: SamplingBatchInfo | None = None

    @classmethod
    def init_new(
        cls,
        reqs: list[Req],
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool_allocator: TokenToKVPoolAllocator,
        model_config: ModelConfig,
    ) -> ScheduleBatch:
        """Group requests; no tensors yet. (SGLang also takes the tree cache, overlap and spec flags.)"""
        return cls(reqs, req_to_token_pool, token_to_kv_pool_allocator, model_config, token_to_kv_pool_allocator.device)

    def prepare_for_extend(self) -> None:
        """Compute each request's tokens past its cached prefix; allocate their KV slots."""
        self.forward_mode = ForwardMode.EXTEND
        input_ids = [r.get_fill_ids()[len(r.prefix_indices) :] for r in self.reqs]
        self.prefix_lens = [len(r.prefix_indices) for r in self.reqs]
        self.extend_lens = [len(ids) for ids in input_ids]
        # Logits come from each request's last new token, so every request must bring at least one.
        assert min(self.extend_lens) > 0, "every request in an extend needs a token past its cached prefix"
        self.extend_num_tokens = sum(self.extend_lens)
        seq_lens = [r.fill_len for r in self.reqs]
        self.input_ids = torch.tensor([t for ids in input_ids for t in ids], dtype=torch.int64).to(self.device)
        self.seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int64)
        # A separate tensor even on CPU (where .to() would alias): both are incremented in place by decode.
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int64, device=self.device)
        self.out_cache_loc, self.req_pool_indices = alloc_for_extend(self)
        self.sampling_info = SamplingBatchInfo.from_schedule_batch(self, self.model_config.vocab_size)

    def prepare_for_decode(self) -> None:
        """One token per request (``input_ids``, set by the caller from the last sample): one new slot each."""
        self.forward_mode = ForwardMode.DECODE
        self.out_cache_loc = alloc_for_decode(self, token_per_req=1)
        self.seq_lens.add_(1)
        self.seq_lens_cpu.add_(1)
