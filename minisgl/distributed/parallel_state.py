"""The tensor-parallel group: which rank this process is, and the two collectives TP layers need.

SGLang's ``parallel_state.py`` (``sglang/srt/distributed/``) builds TP, PP, EP, DP-attention and
world groups, each with custom all-reduce kernels (one-shot/two-shot, NCCL symmetric memory, PyNCCL).
minisgl has one group, the default torch.distributed world, with gloo on CPU and NCCL on CUDA.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_TP_RANK = 0
_TP_SIZE = 1


def init_distributed_environment(tp_rank: int, tp_size: int, init_method: str, device: torch.device) -> None:
    """Join the TP group (a no-op at tp_size 1, so a single process never touches torch.distributed)."""
    global _TP_RANK, _TP_SIZE
    _TP_RANK, _TP_SIZE = tp_rank, tp_size
    if device.type == "cuda" and device.index is not None:
        # NCCL binds each rank to its own GPU, and CUDA graphs capture on the current device: cuda:N, not cuda:0
        torch.cuda.set_device(device)
    if tp_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=init_method, rank=tp_rank, world_size=tp_size)


def destroy_distributed_environment() -> None:
    global _TP_RANK, _TP_SIZE
    if dist.is_initialized():
        dist.destroy_process_group()
    _TP_RANK, _TP_SIZE = 0, 1


def get_tensor_model_parallel_rank() -> int:
    return _TP_RANK


def get_tensor_model_parallel_world_size() -> int:
    return _TP_SIZE


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum partial results of row-parallel layers across ranks (identity on one rank)."""
    if _TP_SIZE > 1:
        dist.all_reduce(x)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor) -> torch.Tensor:
    """Concatenate each rank's slice of the last dimension (the vocab-parallel LM head's logits)."""
    if _TP_SIZE == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_TP_SIZE)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)
