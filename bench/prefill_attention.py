"""Causal prefill attention of one layer alone, each CPU path side by side: SDPA, the query tiles
(``tiled_prefill.py``) and minisgl's C++ kernel (``cpu_prefill.py``), on SmolLM2's and dummy134's head shapes.

    python bench/prefill_attention.py                      # best of five passes per path, us per layer
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from minisgl.layers.attention.cpu_prefill import causal_prefill_attention_cpu
from minisgl.layers.attention.tiled_prefill import causal_prefill_attention
from minisgl.layers.cpu_kernels import cpu_kernels_built

HEADS = {"smollm2": (9, 3, 64), "dummy134": (12, 12, 64)}  # query heads, KV heads, head_dim
SHAPES = [(1, 128), (1, 512), (8, 128)]  # requests, tokens


def sdpa(q, k, v, scale):
    out = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=True, scale=scale,
                                         enable_gqa=True)  # fmt: skip
    return out.transpose(1, 2)


def best_us(fn, passes: int = 5) -> float:
    fn()  # warm-up
    times = []
    for _ in range(passes):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e6


def main() -> None:
    if not cpu_kernels_built():
        raise SystemExit("error: minisgl's C++ kernels are not built here (no compiler?): nothing to compare")
    table = Table(title="causal prefill attention, one layer, us (best of 5)")
    for column in ("heads", "dtype", "requests x tokens", "SDPA", "tiles", "kernel", "best other / kernel"):
        table.add_column(column)
    paths = {"SDPA": sdpa, "tiles": causal_prefill_attention, "kernel": causal_prefill_attention_cpu}
    for name, (heads, kv_heads, head_dim) in HEADS.items():
        for dtype in (torch.float32, torch.bfloat16):
            for requests, tokens in SHAPES:
                q = torch.randn(requests, tokens, heads, head_dim, dtype=dtype)
                k, v = (torch.randn(requests, tokens, kv_heads, head_dim, dtype=dtype) for _ in range(2))
                args = (q, k, v, head_dim**-0.5)
                us = {path: best_us(lambda f=f, args=args: f(*args)) for path, f in paths.items()}
                ratio = min(us["SDPA"], us["tiles"]) / us["kernel"]
                table.add_row(name, str(dtype).removeprefix("torch."), f"{requests}x{tokens}",
                              *(f"{us[p]:.0f}" for p in paths), f"{ratio:.2f}")  # fmt: skip
    Console().print(table)


if __name__ == "__main__":
    main()
