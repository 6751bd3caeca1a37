"""Call chains from minisgl's bench entry points, as ordered trees.

``build_chain(name)`` walks the resolved calls depth-first in call order from the entry function. Each node
carries the callee's qualified name, file and line span. A function already expanded elsewhere in the tree
is shown again but cut (``repeat``); a call back into a function on the current path is cut (``cycle``); a call
in ``DEFERRED`` is cut where it is met and expanded where it is met next (``deferred``).
A call to an abstract method lists the concrete overrides of indexed subclasses as ``dispatch`` children.

Chains: ``latency`` and ``correctness`` start at ``latency_test`` / ``correctness_test``; ``profile`` is the
latency chain pruned to the path that reaches the profiler helpers (``start_profile`` / ``stop_profile``)
and their subtrees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from reader.index import Index, build_index
from reader.resolve import Resolver

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "minisgl"
ENTRIES = {
    "latency": "minisgl.bench_one_batch.latency_test",
    "correctness": "minisgl.bench_one_batch.correctness_test",
    "profile": "minisgl.bench_one_batch.latency_test",
}
PROFILE_HELPERS = ("minisgl.utils.profile_utils.start_profile", "minisgl.utils.profile_utils.stop_profile")
# Types the source cannot state: ``ModelRunner.model`` comes from a registry (``get_model -> nn.Module``).
# Calls resolved through a hint are marked ``via="hint"``.
HINTS = {"minisgl.model_executor.model_runner.ModelRunner.model": "minisgl.models.llama.LlamaForCausalLM"}
# (caller, callee) calls shown but not expanded there (``deferred``): a CUDA graph capture runs the model's forward
# at load, before any request exists; the chain expands that forward where the first extend calls it.
DEFERRED = {
    ("minisgl.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.capture_one_shape",
     "minisgl.models.llama.LlamaForCausalLM.forward"),
}  # fmt: skip


@dataclass
class Node:
    """One call in a chain; ``marker`` is ``""``, ``"repeat"``, ``"cycle"`` or ``"deferred"``."""

    qname: str
    file: Path
    start: int
    end: int
    via: str = "call"
    line: int = 0  # line of the call site in the caller (0 for the root)
    marker: str = ""
    children: list[Node] = field(default_factory=list)

    def walk(self):
        """Yield this node and every descendant, depth-first in call order."""
        yield self
        for c in self.children:
            yield from c.walk()


@dataclass
class Chain:
    name: str
    root: Node
    unresolved: list[tuple[str, str, int]]  # (caller qname, call text, line)
    external: list[tuple[str, str]]  # (caller qname, external dotted name)


@lru_cache(maxsize=4)
def _load(pkg_dir: str) -> tuple[Index, Resolver]:
    index = build_index(pkg_dir)
    return index, Resolver(index, HINTS)


def build_tree(index: Index, resolver: Resolver, entry: str) -> tuple[Node, list, list]:
    """Depth-first call tree from ``entry``, plus the unresolved and external calls met on the way."""
    expanded: set[str] = set()
    unresolved: list[tuple[str, str, int]] = []
    external: list[tuple[str, str]] = []

    def make(qname: str, via: str, line: int, stack: tuple[str, ...]) -> Node:
        fn = index.functions.get(qname)
        info = fn or index.classes[qname]
        node = Node(qname, info.file, info.start, info.end, via, line)
        if fn is None:
            return node
        if qname in stack:
            node.marker = "cycle"
            return node
        if stack and (stack[-1], qname) in DEFERRED:
            node.marker = "deferred"
            return node
        if qname in expanded:
            node.marker = "repeat"
            return node
        expanded.add(qname)
        for call in resolver.resolve(qname).calls:
            if call.kind == "unresolved":
                unresolved.append((qname, call.text, call.line))
            elif call.kind == "external":
                external.append((qname, call.target or ""))
            elif call.in_raise:
                continue  # building the exception of an error path is not part of the chain
            else:
                child = make(call.target, call.via, call.line, stack + (qname,))
                node.children.append(child)
                for impl in call.dispatch:
                    child.children.append(make(impl, "dispatch", call.line, stack + (qname, call.target)))
        return node

    return make(entry, "entry", 0, ()), unresolved, external


def _prune_to(node: Node, targets: tuple[str, ...]) -> Node | None:
    """Keep only the paths from ``node`` that reach one of ``targets`` (targets keep their subtrees)."""
    if node.qname in targets:
        return node
    kept = [k for k in (_prune_to(c, targets) for c in node.children) if k is not None]
    if not kept:
        return None
    return Node(node.qname, node.file, node.start, node.end, node.via, node.line, node.marker, kept)


def build_chain(name: str, pkg_dir: str | Path = PACKAGE_DIR) -> Chain:
    """The named chain (``latency``, ``correctness`` or ``profile``); ``KeyError`` for another name."""
    if name not in ENTRIES:
        raise KeyError(f"unknown chain {name!r}; choose one of {', '.join(ENTRIES)}")
    index, resolver = _load(str(Path(pkg_dir).resolve()))
    root, unresolved, external = build_tree(index, resolver, ENTRIES[name])
    if name == "profile":
        root = _prune_to(root, PROFILE_HELPERS) or root
        kept = {n.qname for n in root.walk()}
        unresolved = [u for u in unresolved if u[0] in kept]
        external = [e for e in external if e[0] in kept]
    return Chain(name, root, unresolved, external)
