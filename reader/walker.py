"""Walk one function body in source order, tracking local types and resolving each call.

``FunctionWalker.run`` visits the body: assignments bind local types (``x = C(...)``, ``a, b = f()``,
``x: T``, ``for x in typed_list``) after the calls on their right-hand side are resolved, so calls are
recorded in execution (post-)order: ``self.o_proj(self.attn(q))`` lists ``attn`` first.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from reader.index import _dotted
from reader.types import ClassObj, ListOf, SuperOf, TupleOf, Type, annotation_type, resolve_dotted

if TYPE_CHECKING:
    from reader.index import ModuleInfo
    from reader.resolve import Resolver

_LIST_BUILDERS = {"torch.nn.ModuleList", "torch.nn.Sequential", "builtins.list", "builtins.tuple"}


@dataclass
class CallSite:
    """One call expression in a function body."""

    text: str
    line: int
    kind: str  # "internal" | "external" | "unresolved"
    target: str | None = None  # internal: indexed function (or class without __init__); external: dotted name
    via: str = "call"  # "call" | "init" (constructor) | "forward" (module __call__) | "hint" (curated type)
    dispatch: list[str] = field(default_factory=list)  # overrides of an abstract target in indexed subclasses
    arg_types: dict = field(default_factory=dict, repr=False)  # (callee, param) -> type, for propagation
    in_raise: bool = False  # the call builds an exception in a ``raise`` statement (an error path)


@dataclass
class _Target:
    kind: str
    target: str | None = None
    via: str = "call"
    rtype: Type = None
    skip_first: bool = False


class FunctionWalker(cst.CSTVisitor):
    """Resolves calls within one function (``qname`` may be ``None`` for a class-body expression)."""

    def __init__(self, resolver: Resolver, qname: str | None, mod: ModuleInfo, env: dict[str, Type], cls: str | None):
        super().__init__()
        self.r, self.qname, self.mod, self.env, self.cls = resolver, qname, mod, env, cls
        self.index = resolver.index
        self.calls: list[CallSite] = []
        self.returns: list[Type] = []
        self._raising = 0

    def run(self, fn: cst.FunctionDef) -> None:
        fn.body.visit(self)

    def return_type(self) -> Type:
        kinds = set(self.returns)
        return self.returns[0] if len(kinds) == 1 else None

    # -- visiting ----------------------------------------------------------------------------------------
    def leave_Call(self, original_node: cst.Call) -> None:
        before = self.r.hints_used
        t = self.callee(original_node)
        text = " ".join(self.mod.tree.code_for_node(original_node).split())
        site = CallSite(text[:100], self.r.line_of(self.mod.name, original_node), t.kind, t.target, t.via)
        if self.r.hints_used != before:
            site.via = "hint"
        site.in_raise = self._raising > 0
        fn = self.index.functions.get(t.target or "")
        if fn is not None:
            site.arg_types = self._arg_types(fn, original_node, t.skip_first)
            if fn.is_abstract:
                site.dispatch = self.r.overrides(fn)
                for impl in site.dispatch:  # the overrides receive the same arguments
                    site.arg_types.update(self._arg_types(self.index.functions[impl], original_node, t.skip_first))
        self.calls.append(site)

    def visit_Raise(self, node: cst.Raise) -> None:
        self._raising += 1

    def leave_Raise(self, original_node: cst.Raise) -> None:
        self._raising -= 1

    def leave_Assign(self, original_node: cst.Assign) -> None:
        t = self.expr_type(original_node.value)
        for target in original_node.targets:
            self._bind(target.target, t)

    def leave_AnnAssign(self, original_node: cst.AnnAssign) -> None:
        t = annotation_type(self.index, self.mod, original_node.annotation.annotation)
        self._bind(original_node.target, t)

    def visit_For(self, node: cst.For) -> None:
        t = self.expr_type(node.iter)
        self._bind(node.target, t.item if isinstance(t, ListOf) else None)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        t = self.expr_type(node.iter)
        self._bind(node.target, t.item if isinstance(t, ListOf) else None)

    def _bind_comprehension(self, node: cst.BaseComp | cst.DictComp) -> None:
        """Bind the ``for`` targets before the element is visited (libcst visits ``elt`` first)."""
        comp: cst.CompFor | None = node.for_in
        while comp is not None:
            self.visit_CompFor(comp)
            comp = comp.inner_for_in

    def visit_ListComp(self, node: cst.ListComp) -> None:
        self._bind_comprehension(node)

    def visit_SetComp(self, node: cst.SetComp) -> None:
        self._bind_comprehension(node)

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> None:
        self._bind_comprehension(node)

    def visit_DictComp(self, node: cst.DictComp) -> None:
        self._bind_comprehension(node)

    def leave_WithItem(self, original_node: cst.WithItem) -> None:
        if original_node.asname is not None:
            t = self.expr_type(original_node.item)
            enter = self.r.lookup_method(t, "__enter__") if isinstance(t, str) and t in self.index.classes else None
            self._bind(original_node.asname.name, self.r.resolve(enter).returns if enter else None)

    def leave_Return(self, original_node: cst.Return) -> None:
        if original_node.value is not None:
            self.returns.append(self.expr_type(original_node.value))

    def _bind(self, target: cst.BaseExpression, t: Type) -> None:
        if isinstance(target, cst.Name):
            self.env[target.value] = t
        elif isinstance(target, (cst.Tuple, cst.List)):
            items = t.items if isinstance(t, TupleOf) and len(t.items) == len(target.elements) else None
            for i, el in enumerate(target.elements):
                self._bind(el.value, items[i] if items else None)

    def _arg_types(self, fn, call: cst.Call, skip_first: bool) -> dict:
        params = list(fn.node.params.posonly_params) + list(fn.node.params.params)
        if skip_first:
            params = params[1:]
        by_name = {p.name.value: p for p in params + list(fn.node.params.kwonly_params)}
        out = {}
        for i, arg in enumerate(call.args):
            if arg.star:
                break
            p = by_name.get(arg.keyword.value) if arg.keyword else (params[i] if i < len(params) else None)
            if p is not None and p.annotation is None:
                out[(fn.qname, p.name.value)] = self.expr_type(arg.value)
        return out

    # -- calls -------------------------------------------------------------------------------------------
    def callee(self, call: cst.Call) -> _Target:
        """What ``call`` calls, and the type of its result."""
        func = call.func
        if isinstance(func, cst.Name):
            name = func.value
            if name in self.env:
                return self._call_object(self.env[name])
            fq = resolve_dotted(self.index, self.mod, name)
            if fq:
                return self._call_fq(fq)
            if name == "super":
                return _Target("external", "builtins.super", rtype=SuperOf(self.cls) if self.cls else None)
            if hasattr(builtins, name):
                return _Target("external", f"builtins.{name}", rtype=self._builtin_result(name, call))
            return _Target("unresolved")
        if isinstance(func, cst.Attribute):
            dotted = _dotted(func)
            if dotted and dotted.split(".")[0] not in self.env:
                fq = resolve_dotted(self.index, self.mod, dotted)
                owner = fq.rpartition(".")[0] if fq else ""
                if fq and fq not in self.index.functions and owner in self.index.classes:
                    return self._method(ClassObj(owner), func.attr.value)  # inherited ``Cls.method()``
                if fq:
                    target = self._call_fq(fq)
                    if fq in _LIST_BUILDERS:
                        target.rtype = self._container_of(call)
                    return target
            return self._method(self.expr_type(func.value), func.attr.value)
        return self._call_object(self.expr_type(func))

    def _builtin_result(self, name: str, call: cst.Call) -> Type:
        return self._container_of(call) if name in ("list", "tuple") else None

    def _container_of(self, call: cst.Call) -> Type:
        if len(call.args) == 1:
            item = self.expr_type(call.args[0].value)
            return item if isinstance(item, ListOf) else None
        return None

    def _call_fq(self, fq: str) -> _Target:
        if fq in self.index.functions:
            fn = self.index.functions[fq]
            return _Target("internal", fq, rtype=self.r.resolve(fq).returns, skip_first=fn.kind == "classmethod")
        if fq in self.index.classes:
            init = self.r.lookup_method(fq, "__init__")
            return _Target("internal", init or fq, "init", fq, skip_first=True)
        if self.index.owns(fq):
            return _Target("unresolved")
        return _Target("external", fq)

    def _call_object(self, t: Type) -> _Target:
        if isinstance(t, ClassObj):
            return self._call_fq(t.qname)
        if isinstance(t, str) and t in self.index.classes:
            m = self.r.lookup_method(t, "__call__") or self.r.lookup_method(t, "forward")
            if m:
                return _Target("internal", m, "forward", self.r.resolve(m).returns, skip_first=True)
            return _Target("unresolved")
        if isinstance(t, str):
            return _Target("external", f"{t}.__call__")
        return _Target("unresolved")

    def _method(self, t: Type, attr: str) -> _Target:
        if isinstance(t, SuperOf):
            m = self.r.lookup_method(t.qname, attr, after=t.qname)
            if m:
                return _Target("internal", m, rtype=self.r.resolve(m).returns, skip_first=True)
            base = self.r.external_base(t.qname)
            return _Target("external", f"{base}.{attr}") if base else _Target("unresolved")
        cls = t.qname if isinstance(t, ClassObj) else t
        if isinstance(cls, str) and cls in self.index.classes:
            m = self.r.lookup_method(cls, attr)
            if m:
                fn = self.index.functions[m]
                bound = fn.kind == "classmethod" or (fn.kind == "method" and not isinstance(t, ClassObj))
                return _Target("internal", m, rtype=self.r.resolve(m).returns, skip_first=bound)
            if self._known_attr(cls, attr):
                return self._call_object(self.r.attr_type(cls, attr))
            base = self.r.external_base(cls)
            return _Target("external", f"{base}.{attr}") if base else _Target("unresolved")
        if isinstance(cls, str):
            return _Target("external", f"{cls}.{attr}")
        if isinstance(t, (ListOf, TupleOf)):
            return _Target("external", f"builtins.{'list' if isinstance(t, ListOf) else 'tuple'}.{attr}")
        return _Target("unresolved")

    def _known_attr(self, cls: str, attr: str) -> bool:
        for c in self.r.mro(cls):
            info = self.index.classes.get(c)
            if info and (attr in info.attr_annotations or attr in info.attr_assigns or f"{c}.{attr}" in self.r.hints):
                return True
        return False

    # -- expressions -------------------------------------------------------------------------------------
    def expr_type(self, e: cst.BaseExpression) -> Type:
        """Static type of expression ``e`` in the current environment (``None`` when unknown)."""
        if isinstance(e, cst.Name):
            if e.value in self.env:
                return self.env[e.value]
            fq = resolve_dotted(self.index, self.mod, e.value)
            return ClassObj(fq) if fq and fq in self.index.classes else None
        if isinstance(e, cst.Attribute):
            dotted = _dotted(e)
            if dotted and dotted.split(".")[0] not in self.env:
                fq = resolve_dotted(self.index, self.mod, dotted)
                if fq:
                    return ClassObj(fq) if fq in self.index.classes else None
            t = self.expr_type(e.value)
            cls = t.qname if isinstance(t, ClassObj) else t
            if isinstance(cls, str) and cls in self.index.classes:
                return self.r.attr_type(cls, e.attr.value)
            return None
        if isinstance(e, cst.Call):
            return self.callee(e).rtype
        if isinstance(e, cst.Subscript):
            t = self.expr_type(e.value)
            if isinstance(t, ListOf):
                return t.item
            idx = e.slice[0].slice if len(e.slice) == 1 else None
            if isinstance(t, TupleOf) and isinstance(idx, cst.Index) and isinstance(idx.value, cst.Integer):
                i = int(idx.value.value)
                return t.items[i] if i < len(t.items) else None
            return None
        if isinstance(e, cst.Tuple):
            return TupleOf(tuple(self.expr_type(el.value) for el in e.elements))
        if isinstance(e, (cst.ListComp, cst.GeneratorExp)):
            self._bind_comprehension(e)
            return ListOf(self.expr_type(e.elt))
        if isinstance(e, cst.List):
            return ListOf(self.expr_type(e.elements[0].value) if e.elements else None)
        if isinstance(e, (cst.Dict, cst.DictComp)):
            return "builtins.dict"
        if isinstance(e, cst.IfExp):
            a, b = self.expr_type(e.body), self.expr_type(e.orelse)
            return a if a == b else None
        return None
