"""What SGLang's counterpart does that minisgl's piece does not, computed from both sources.

Three lists, each from libcst alone: calls the SGLang piece makes whose callee name minisgl's piece
never calls; the feature flags and attributes it consults (overlap, speculative decoding,
disaggregation, LoRA, grammar, ...), grouped by feature; and its ``if`` branches on those features.
"""

from __future__ import annotations

import builtins
import re
from dataclasses import dataclass, field

import libcst as cst

FEATURES = {
    "overlap scheduling": r"overlap",
    "speculative decoding": r"spec|eagle|draft|ngram",
    "PD disaggregation": r"disagg|bootstrap|kv_send|prefill_only",
    "LoRA": r"lora",
    "grammar / constrained decoding": r"grammar|vocab_mask|regex",
    "DP attention / MLP sync": r"dp_attention|mlp_sync|dp_size|global_num_tokens|attn_tp",
    "pipeline parallel": r"\bpp_|pp_size|pp_rank|pp_proxy",
    "CUDA graphs": r"cuda_graph|graph_runner|capture",
    "hybrid memory (SWA / mamba)": r"swa|mamba|hybrid",
    "hierarchical / radix cache": r"hicache|radix|tree_cache|evict|hisparse",
    "multimodal": r"\bmm_|multimodal|mrope|image|audio",
    "logprobs": r"logprob",
    "penalties / logit bias": r"penal|logit_bias|custom_logit",
    "chunked prefill": r"chunk",
    "quantization": r"quant|fp8|fp4",
    "deterministic inference": r"determin|sampling_seed",
}


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    if isinstance(node, cst.Call):
        return f"{_dotted(node.func)}()"
    return "…"


class _Collector(cst.CSTVisitor):
    def __init__(self):
        self.calls: list[str] = []
        self.attributes: list[str] = []
        self.branches: list[str] = []

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(_dotted(node.func))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.attributes.append(_dotted(node))

    def visit_If(self, node: cst.If) -> None:
        self.branches.append(cst.Module([]).code_for_node(node.test))


def collect(node: cst.CSTNode) -> _Collector:
    collector = _Collector()
    node.visit(collector)
    return collector


@dataclass
class Additions:
    calls: list[str] = field(default_factory=list)  # SGLang callees minisgl's piece does not call
    features: dict[str, list[str]] = field(default_factory=dict)  # feature -> attributes consulted
    branches: list[str] = field(default_factory=list)  # if-conditions on those features


def _leaf(name: str) -> str:
    return name.rstrip("()").rsplit(".", 1)[-1]


def what_sglang_adds(sglang_node: cst.CSTNode, minisgl_node: cst.CSTNode) -> Additions:
    ours, theirs = collect(minisgl_node), collect(sglang_node)
    our_leaves = {_leaf(c) for c in ours.calls}
    extra_calls = sorted({c for c in theirs.calls if _leaf(c) not in our_leaves and not hasattr(builtins, c)})
    features: dict[str, list[str]] = {}
    for attr in sorted(set(theirs.attributes) - set(ours.attributes)):
        for feature, pattern in FEATURES.items():
            if re.search(pattern, attr.rsplit(".", 1)[-1], re.IGNORECASE):
                features.setdefault(feature, []).append(attr)
                break
    branches = [b for b in theirs.branches if any(re.search(p, b, re.IGNORECASE) for p in FEATURES.values())]
    return Additions(extra_calls, features, branches)
