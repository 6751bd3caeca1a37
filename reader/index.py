"""Index a package directory with libcst, without importing it.

``build_index(pkg_dir)`` parses every ``.py`` file under ``pkg_dir`` and records modules (with their import
aliases), classes (bases, methods, attribute annotations and assignments) and functions/methods with their
qualified names (``minisgl.managers.schedule_batch.ScheduleBatch.prepare_for_extend``) and real line spans:
the span starts at the first decorator or at the comment block directly above, and ends at the last line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider


@dataclass
class FunctionInfo:
    """A module-level function or a method."""

    qname: str
    module: str
    file: Path
    start: int
    end: int
    node: cst.FunctionDef
    cls: str | None = None
    decorators: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.node.name.value

    @property
    def is_abstract(self) -> bool:
        return "abstractmethod" in self.decorators

    @property
    def kind(self) -> str:
        """``staticmethod``, ``classmethod``, ``method`` or ``function``."""
        for d in ("staticmethod", "classmethod"):
            if d in self.decorators:
                return d
        return "method" if self.cls else "function"


@dataclass
class ClassInfo:
    """A class: its bases as written (resolved later), methods and attribute sources."""

    qname: str
    module: str
    file: Path
    start: int
    end: int
    node: cst.ClassDef
    bases: list[cst.BaseExpression] = field(default_factory=list)
    methods: dict[str, str] = field(default_factory=dict)
    # attribute name -> annotation node (class-body ``x: T`` or ``self.x: T`` in a method)
    attr_annotations: dict[str, cst.BaseExpression] = field(default_factory=dict)
    # attribute name -> [(value expression, qualified name of the method it is assigned in, or None)]
    attr_assigns: dict[str, list[tuple[cst.BaseExpression, str | None]]] = field(default_factory=dict)


@dataclass
class ModuleInfo:
    """A parsed module and the names its imports bind (local name -> dotted target)."""

    name: str
    file: Path
    tree: cst.Module
    imports: dict[str, str] = field(default_factory=dict)


@dataclass
class Index:
    """Everything ``build_index`` found, keyed by qualified name."""

    root: str
    modules: dict[str, ModuleInfo] = field(default_factory=dict)
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    functions: dict[str, FunctionInfo] = field(default_factory=dict)

    def owns(self, dotted: str) -> bool:
        """True when ``dotted`` names something inside the indexed package."""
        return dotted == self.root or dotted.startswith(self.root + ".")


def _dotted(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr.value}" if head else None
    return None


def _decorator_name(dec: cst.Decorator) -> str:
    expr = dec.decorator.func if isinstance(dec.decorator, cst.Call) else dec.decorator
    return (_dotted(expr) or "").rsplit(".", 1)[-1]


def _span(node: cst.FunctionDef | cst.ClassDef, pos: PositionProvider) -> tuple[int, int]:
    rng = pos[node]
    start = pos[node.decorators[0]].start.line if node.decorators else rng.start.line
    for line in reversed(node.leading_lines):  # the comment block directly above belongs to the piece
        if line.comment is None:
            break
        start -= 1
    return start, rng.end.line


def _relative(module: str, is_pkg: bool, level: int, target: str | None) -> str:
    parts = module.split(".")
    base = parts if is_pkg else parts[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([target] if target else []))


class _Collector(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, index: Index, mod: ModuleInfo, is_pkg: bool):
        super().__init__()
        self.index, self.mod, self.is_pkg = index, mod, is_pkg
        self.scope: list[tuple[str, str]] = []  # (kind, qname)

    def _qname(self, name: str) -> str:
        return f"{self.scope[-1][1] if self.scope else self.mod.name}.{name}"

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            full = _dotted(alias.name) or ""
            if alias.asname is not None:
                self.mod.imports[alias.asname.name.value] = full
            else:
                head = full.split(".")[0]
                self.mod.imports[head] = head

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        target = _dotted(node.module) if node.module is not None else None
        if node.relative:
            target = _relative(self.mod.name, self.is_pkg, len(node.relative), target)
        if isinstance(node.names, cst.ImportStar) or not target:
            return
        for alias in node.names:
            name = _dotted(alias.name) or ""
            local = alias.asname.name.value if alias.asname is not None else name
            self.mod.imports[local] = f"{target}.{name}"

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        qname = self._qname(node.name.value)
        start, end = _span(node, self.metadata[PositionProvider])
        info = ClassInfo(qname, self.mod.name, self.mod.file, start, end, node, [a.value for a in node.bases])
        self.index.classes[qname] = info
        for stmt in node.body.body:  # class-body annotations and plain assignments
            for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else []:
                if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
                    info.attr_annotations[small.target.value] = small.annotation.annotation
                elif isinstance(small, cst.Assign):
                    for t in small.targets:
                        if isinstance(t.target, cst.Name):
                            info.attr_assigns.setdefault(t.target.value, []).append((small.value, None))
        self.scope.append(("class", qname))

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.scope.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        if self.scope and self.scope[-1][0] == "function":
            return False  # nested functions are part of their enclosing function
        qname = self._qname(node.name.value)
        cls = self.scope[-1][1] if self.scope and self.scope[-1][0] == "class" else None
        start, end = _span(node, self.metadata[PositionProvider])
        decos = [_decorator_name(d) for d in node.decorators]
        self.index.functions[qname] = FunctionInfo(qname, self.mod.name, self.mod.file, start, end, node, cls, decos)
        if cls:
            self.index.classes[cls].methods[node.name.value] = qname
            _collect_self_attrs(node, self.index.classes[cls], qname)
        self.scope.append(("function", qname))
        return True

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        if self.scope and self.scope[-1][1] == self._qname_of_leaving(original_node):
            self.scope.pop()

    def _qname_of_leaving(self, node: cst.FunctionDef) -> str:
        parent = self.scope[-2][1] if len(self.scope) > 1 else self.mod.name
        return f"{parent}.{node.name.value}"


def _collect_self_attrs(fn: cst.FunctionDef, info: ClassInfo, qname: str) -> None:
    """Record ``self.x: T`` and ``self.x = value`` (also inside tuple targets) in a method body."""
    params = fn.params.params
    if not params:
        return
    self_name = params[0].name.value

    def is_self_attr(t: cst.BaseExpression) -> str | None:
        if isinstance(t, cst.Attribute) and isinstance(t.value, cst.Name) and t.value.value == self_name:
            return t.attr.value
        return None

    class V(cst.CSTVisitor):
        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            name = is_self_attr(node.target)
            if name:
                info.attr_annotations.setdefault(name, node.annotation.annotation)

        def visit_Assign(self, node: cst.Assign) -> None:
            for t in node.targets:
                name = is_self_attr(t.target)
                if name:
                    info.attr_assigns.setdefault(name, []).append((node.value, qname))
                elif isinstance(t.target, cst.Tuple) and isinstance(node.value, cst.Tuple):
                    for el, val in zip(t.target.elements, node.value.elements):
                        sub = is_self_attr(el.value)
                        if sub:
                            info.attr_assigns.setdefault(sub, []).append((val.value, qname))

    fn.body.visit(V())


def module_name(pkg_dir: Path, path: Path) -> tuple[str, bool]:
    """Dotted module name of ``path`` inside the package rooted at ``pkg_dir``, and whether it is a package."""
    rel = path.relative_to(pkg_dir.parent).with_suffix("")
    parts = list(rel.parts)
    is_pkg = parts[-1] == "__init__"
    if is_pkg:
        parts = parts[:-1]
    return ".".join(parts), is_pkg


def build_index(pkg_dir: str | Path) -> Index:
    """Parse every module of the package at ``pkg_dir`` (a directory with ``__init__.py``)."""
    pkg_dir = Path(pkg_dir).resolve()
    index = Index(root=pkg_dir.name)
    for path in sorted(pkg_dir.rglob("*.py")):
        name, is_pkg = module_name(pkg_dir, path)
        wrapper = MetadataWrapper(cst.parse_module(path.read_text(encoding="utf-8")))
        mod = ModuleInfo(name, path, wrapper.module)
        index.modules[name] = mod
        wrapper.visit(_Collector(index, mod, is_pkg))
    return index
