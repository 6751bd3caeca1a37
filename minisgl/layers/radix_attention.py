"""RadixAttention: the attention op a model layer calls; the work happens in the attention backend.

It only carries the layer's shape (heads, head_dim, scaling, layer_id) and hands q/k/v to
``forward_batch.attn_backend``, so models are independent of the kernel choice. SGLang's version adds
sliding windows, cross attention, logit caps and the piecewise-CUDA-graph entry point.
"""

from __future__ import annotations

import torch
from torch import nn

from minisgl.model_executor.forward_batch_info import ForwardBatch


class RadixAttention(nn.Module):
    def __init__(self, num_heads: int, head_dim: int, scaling: float, num_kv_heads: int, layer_id: int):
        super().__init__()
        self.tp_q_head_num = num_heads
        self.tp_k_head_num = num_kv_heads
        self.tp_v_head_num = num_kv_heads
        self.head_dim = head_dim
        self.scaling = scaling
        self.layer_id = layer_id

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, forward_batch: ForwardBatch):
        k = k.view(-1, self.tp_k_head_num, self.head_dim)
        v = v.view(-1, self.tp_v_head_num, self.head_dim)
        return forward_batch.attn_backend.forward(q, k, v, self, forward_batch)
