"""Resolve the calls inside each indexed function to indexed functions, external names or "unresolved".

Types come only from what the source states: parameter, return, class-body and ``self.x: T`` annotations,
constructor calls (``x = C(...)``, ``self.x = C(...)``), return annotations of resolved callees, the
return statements of unannotated callees, and -- for unannotated parameters -- the argument types every
resolved call site passes (when all agree). ``nn.Module`` style ``obj(...)`` on an instance of an indexed
class with a ``forward`` resolves to that ``forward``. Anything else is listed as unresolved, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from reader.index import FunctionInfo, Index, _dotted
from reader.types import ClassObj, Type, annotation_type, resolve_dotted
from reader.walker import CallSite, FunctionWalker


@dataclass
class Resolved:
    calls: list[CallSite]
    returns: Type


class Resolver:
    """Resolves calls of indexed functions; ``hints`` maps ``Class.attr`` qualified names to a class FQN for
    attributes whose type the source does not state (e.g. a model built from a registry)."""

    def __init__(self, index: Index, hints: dict[str, str] | None = None, rounds: int = 3):
        self.index = index
        self.hints = hints or {}
        self.param_hints: dict[tuple[str, str], Type] = {}
        self.hints_used = 0
        self._cache: dict[str, Resolved] = {}
        self._busy: set[str] = set()
        self._attr_busy: set[tuple[str, str]] = set()
        self._positions: dict[str, object] = {}
        for _ in range(rounds):  # propagate argument types into unannotated parameters until stable
            before = dict(self.param_hints)
            self._propagate_params()
            if self.param_hints == before:
                break

    # -- classes -----------------------------------------------------------------------------------------
    def mro(self, cls: str) -> list[str]:
        """Indexed classes first (depth-first, left to right, no repeats), then external bases."""
        out: list[str] = []

        def walk(c: str) -> None:
            if c in out:
                return
            out.append(c)
            info = self.index.classes.get(c)
            if info is None:
                return
            mod = self.index.modules[info.module]
            for b in info.bases:
                d = _dotted(b)
                fq = resolve_dotted(self.index, mod, d) if d else None
                if fq:
                    walk(fq)

        walk(cls)
        return out

    def lookup_method(self, cls: str, name: str, after: str | None = None) -> str | None:
        chain = self.mro(cls)
        if after is not None:
            chain = chain[chain.index(after) + 1 :] if after in chain else []
        for c in chain:
            info = self.index.classes.get(c)
            if info and name in info.methods:
                return info.methods[name]
        return None

    def external_base(self, cls: str) -> str | None:
        return next((c for c in self.mro(cls) if c not in self.index.classes), None)

    def overrides(self, fn: FunctionInfo) -> list[str]:
        """Methods of indexed subclasses that override ``fn`` (for abstract-method dispatch)."""
        out = []
        for qn, info in self.index.classes.items():
            if qn != fn.cls and fn.cls in self.mro(qn) and fn.name in info.methods:
                out.append(info.methods[fn.name])
        return out

    def attr_type(self, cls: str, attr: str) -> Type:
        for c in self.mro(cls):
            info = self.index.classes.get(c)
            if info is None:
                continue
            if f"{c}.{attr}" in self.hints:
                self.hints_used += 1
                return self.hints[f"{c}.{attr}"]
            mod = self.index.modules[info.module]
            if attr in info.attr_annotations:
                return annotation_type(self.index, mod, info.attr_annotations[attr])
            key = (c, attr)
            if key in self._attr_busy:
                return None
            self._attr_busy.add(key)
            try:
                for value, method in info.attr_assigns.get(attr, []):
                    env = self._param_env(self.index.functions[method]) if method else {}
                    t = FunctionWalker(self, method, mod, env, c).expr_type(value)
                    if t is not None:
                        return t
            finally:
                self._attr_busy.discard(key)
        return None

    # -- functions ---------------------------------------------------------------------------------------
    def _param_env(self, fn: FunctionInfo) -> dict[str, Type]:
        mod = self.index.modules[fn.module]
        env: dict[str, Type] = {}
        params = list(fn.node.params.posonly_params) + list(fn.node.params.params)
        for i, p in enumerate(params + list(fn.node.params.kwonly_params)):
            name = p.name.value
            if i == 0 and fn.cls and fn.kind == "method":
                env[name] = fn.cls
            elif i == 0 and fn.cls and fn.kind == "classmethod":
                env[name] = ClassObj(fn.cls)
            elif p.annotation is not None:
                env[name] = annotation_type(self.index, mod, p.annotation.annotation)
            else:
                env[name] = self.param_hints.get((fn.qname, name))
        return env

    def resolve(self, qname: str) -> Resolved:
        """Calls (in execution order) and inferred return type of the indexed function ``qname``."""
        if qname in self._cache:
            return self._cache[qname]
        if qname in self._busy:
            return Resolved([], None)
        self._busy.add(qname)
        hints_before = self.hints_used  # hints used inside a callee do not mark the caller's call site
        try:
            fn = self.index.functions[qname]
            mod = self.index.modules[fn.module]
            walker = FunctionWalker(self, qname, mod, self._param_env(fn), fn.cls)
            walker.run(fn.node)
            declared = fn.node.returns
            rtype = annotation_type(self.index, mod, declared.annotation) if declared else walker.return_type()
            result = Resolved(walker.calls, rtype)
        finally:
            self._busy.discard(qname)
            self.hints_used = hints_before
        self._cache[qname] = result
        return result

    def line_of(self, module: str, node: cst.CSTNode) -> int:
        """1-based line where ``node`` (a node of the indexed tree of ``module``) starts."""
        if module not in self._positions:
            wrapper = MetadataWrapper(self.index.modules[module].tree, unsafe_skip_copy=True)
            self._positions[module] = wrapper.resolve(PositionProvider)
        return self._positions[module][node].start.line

    def _propagate_params(self) -> None:
        seen: dict[tuple[str, str], set] = {}
        self._cache.clear()
        for qname in self.index.functions:
            self.resolve(qname)
        for qname in self.index.functions:
            for call in self._cache[qname].calls:
                for key, t in getattr(call, "arg_types", {}).items():
                    seen.setdefault(key, set()).add(t)
        for key, types in seen.items():
            if len(types) == 1 and None not in types:
                self.param_hints[key] = next(iter(types))
        self._cache.clear()
