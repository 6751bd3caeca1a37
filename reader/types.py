"""Static types as ``reader`` understands them, and how annotations become types.

A type is one of:

* ``"pkg.mod.Class"`` -- an instance of that class (indexed, or external such as ``"torch.Tensor"``);
* ``ClassObj("pkg.mod.Class")`` -- the class object itself (``Cls.method()``, ``self.layer_cls(...)``);
* ``TupleOf((t1, t2))`` -- a tuple, for ``a, b = f()``;
* ``ListOf(t)`` -- a homogeneous container (``nn.ModuleList(C(...) for ...)``), for ``for x in ...``;
* ``SuperOf("pkg.mod.Class")`` -- ``super()`` inside that class;
* ``None`` -- unknown. Nothing is ever guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from reader.index import Index, ModuleInfo, _dotted


@dataclass(frozen=True)
class ClassObj:
    qname: str


@dataclass(frozen=True)
class TupleOf:
    items: tuple


@dataclass(frozen=True)
class ListOf:
    item: object


@dataclass(frozen=True)
class SuperOf:
    qname: str


Type = str | ClassObj | TupleOf | ListOf | SuperOf | None

_BUILTIN_SCALARS = {"int", "float", "str", "bool", "bytes", "dict", "set", "object", "list", "tuple", "type"}
_CONTAINERS = {"list", "List", "Sequence", "Iterable", "Iterator", "set", "Set", "frozenset", "Generator"}


def resolve_dotted(index: Index, mod: ModuleInfo, dotted: str) -> str | None:
    """Map a dotted name as written in ``mod`` to a fully qualified name (``None`` for unknown bare names)."""
    head, _, rest = dotted.partition(".")
    if head in mod.imports:
        target = mod.imports[head]
    elif f"{mod.name}.{head}" in index.classes or f"{mod.name}.{head}" in index.functions:
        target = f"{mod.name}.{head}"
    else:
        return None
    return follow_reexport(index, f"{target}.{rest}" if rest else target)


def follow_reexport(index: Index, fq: str) -> str:
    """``pkg.Name`` re-exported by ``pkg/__init__.py`` (``from .mod import Name``) -> ``pkg.mod.Name``."""
    for _ in range(5):
        if fq in index.classes or fq in index.functions:
            return fq
        mod, _, name = fq.rpartition(".")
        info = index.modules.get(mod)
        if info is None or name not in info.imports:
            return fq
        fq = info.imports[name]
    return fq


def annotation_type(index: Index, mod: ModuleInfo, ann: cst.BaseExpression | None) -> Type:
    """Turn an annotation into a type: string forward refs, ``Optional``, ``X | None``, ``tuple[...]``."""
    if ann is None:
        return None
    if isinstance(ann, cst.SimpleString):
        try:
            return annotation_type(index, mod, cst.parse_expression(ann.evaluated_value))
        except Exception:  # a string that is not an expression is not a type
            return None
    if isinstance(ann, cst.BinaryOperation) and isinstance(ann.operator, cst.BitOr):
        arms = [a for a in (ann.left, ann.right) if not (isinstance(a, cst.Name) and a.value == "None")]
        return annotation_type(index, mod, arms[0]) if len(arms) == 1 else None
    if isinstance(ann, cst.Subscript):
        base = (_dotted(ann.value) or "").rsplit(".", 1)[-1]
        args = [e.slice.value for e in ann.slice if isinstance(e.slice, cst.Index)]
        if base == "Optional" and args:
            return annotation_type(index, mod, args[0])
        if base == "Union":
            arms = [a for a in args if not (isinstance(a, cst.Name) and a.value == "None")]
            return annotation_type(index, mod, arms[0]) if len(arms) == 1 else None
        if base in ("tuple", "Tuple"):
            return TupleOf(tuple(annotation_type(index, mod, a) for a in args))
        if base in _CONTAINERS and args:
            item = annotation_type(index, mod, args[0])
            return ListOf(item) if item is not None else None
        if base in ("type", "Type") and args:
            inner = annotation_type(index, mod, args[0])
            return ClassObj(inner) if isinstance(inner, str) else None
        return None
    dotted = _dotted(ann)
    if dotted is None or dotted in _BUILTIN_SCALARS or dotted == "None":
        return None
    return resolve_dotted(index, mod, dotted)
