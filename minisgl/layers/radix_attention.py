"""RadixAttention: the attention op a model layer calls; the work happens in the attention backend.

It only carries the layer's shape (heads, head_dim, scaling, layer_id) and hands q/k/v to
``forward_batch.attn_backend``, so models are independent of the kernel choice. Under ``torch.compile``,
decode attention and the extend of a single request are traced into the graph like the rest of the layer
(their shapes are symbolic; a CPU extend calls minisgl's C++ prefill kernel there as an opaque op, or, where it
is not built, past one query tile the opaque ``causal_prefill_attention``, where the tiles apply), while an extend of several requests goes through ``unified_attention``, a
custom op the compiler treats as a black box: it loops over requests whose lengths would otherwise
recompile the graph.
SGLang's version adds sliding windows, cross attention and logit caps, and its
``unified_attention_with_output`` plays the same role for piecewise CUDA graphs.
"""

from __future__ import annotations

import torch
from torch import nn

from minisgl.model_executor.forward_batch_info import ForwardBatch
from minisgl.model_executor.forward_context import get_forward_context


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
        # batch_size costs no extra graph: dynamo already compiles extends of one request apart (size-1 dims).
        if torch.compiler.is_compiling() and forward_batch.forward_mode.is_extend() and forward_batch.batch_size > 1:
            return unified_attention(q, k, v, self.layer_id)
        return forward_batch.attn_backend.forward(q, k, v, self, forward_batch)


@torch.library.custom_op("minisgl::unified_attention", mutates_args=())
def unified_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
    """The backend's attention for layer ``layer_id`` of the batch in the current forward context."""
    ctx = get_forward_context()
    return ctx.forward_batch.attn_backend.forward(q, k, v, ctx.attention_layers[layer_id], ctx.forward_batch)


@unified_attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
    return q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
