"""Terminal views: a piece beside its SGLang counterpart, what the counterpart adds, the scheduler loop
beside the bench, and the drift check. Rendered with rich; code keeps its real line numbers."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.syntax import Syntax
from rich.table import Table

from reader.chains import ENTRIES, PACKAGE_DIR, _load, build_chain
from reader.compare import what_sglang_adds
from reader.pieces import SCHEDULER_STEPS, check, counterpart_of, resolve_name
from reader.sglang_source import ReaderError, SourcePiece, find_piece

REPO_ROOT = PACKAGE_DIR.parent


def minisgl_piece(qname: str) -> SourcePiece:
    index, _ = _load(str(PACKAGE_DIR.resolve()))
    info = index.functions.get(qname) or index.classes[qname]
    rel = str(info.file.resolve().relative_to(REPO_ROOT))
    code = "\n".join(info.file.read_text().splitlines()[info.start - 1 : info.end])
    return SourcePiece(qname, rel, info.start, info.end, code, info.node)


def sglang_piece(sglang_root: Path, qname: str) -> SourcePiece | None:
    """The counterpart's source, None when the piece has none; an error when the mapping points nowhere."""
    mapping = counterpart_of(qname)
    if mapping is None or mapping.qualname is None:
        return None
    piece = find_piece(sglang_root, mapping.path, mapping.qualname)
    if piece is None:
        raise ReaderError(f"{mapping.path}::{mapping.qualname} is not in the SGLang source at {sglang_root}")
    return piece


def chain_edges() -> dict[str, tuple[set[str], set[str]]]:
    """qname -> (callers, callees) over all chains."""
    edges: dict[str, tuple[set[str], set[str]]] = {}
    for name in ENTRIES:
        for node in build_chain(name).root.walk():
            edges.setdefault(node.qname, (set(), set()))
            for child in node.children:
                edges.setdefault(child.qname, (set(), set()))[0].add(node.qname)
                edges[node.qname][1].add(child.qname)
    return edges


def _code(piece: SourcePiece) -> Syntax:
    return Syntax(piece.code, "python", line_numbers=True, start_line=piece.start, word_wrap=True)


def show(console: Console, sglang_root: Path, name: str, diff_only: bool = False) -> None:
    index, _ = _load(str(PACKAGE_DIR.resolve()))
    qname = resolve_name(index, name)
    ours, mapping = minisgl_piece(qname), counterpart_of(qname)
    theirs = sglang_piece(sglang_root, qname)
    console.print(f"[bold]{escape(qname)}[/]  {ours.path}:{ours.start}-{ours.end}")
    if theirs is None:
        reason = mapping.reason if mapping else "not mapped yet (reader check reports it)"
        console.print(f"SGLang counterpart: none ({escape(reason)})")
    else:
        console.print(f"SGLang counterpart: [bold]{theirs.qualname}[/]  {theirs.path}:{theirs.start}-{theirs.end}")
    if not diff_only:
        callers, callees = chain_edges().get(qname, (set(), set()))
        console.print(f"called by: {', '.join(sorted(c.removeprefix('minisgl.') for c in callers)) or '-'}")
        console.print(f"calls: {', '.join(sorted(c.removeprefix('minisgl.') for c in callees)) or '-'}")
    if theirs is not None and diff_only:
        adds = what_sglang_adds(theirs.node, ours.node)
        console.print("\n[bold]What SGLang's piece does that minisgl's does not[/]")
        console.print(f"calls without a counterpart here: {escape(', '.join(adds.calls)) or '-'}")
        for feature, attrs in adds.features.items():
            console.print(f"  {feature}: {escape(', '.join(attrs))}", soft_wrap=True)
        for branch in adds.branches:
            console.print(f"  branch: if {escape(branch)}", soft_wrap=True)
    table = Table(show_header=True, expand=True)
    table.add_column(f"minisgl  {ours.path}")
    if theirs is not None:
        table.add_column(f"SGLang 0.5.14  {theirs.path}")
        table.add_row(_code(ours), _code(theirs))
    else:
        table.add_row(_code(ours))
    console.print(table)


def scheduler(console: Console, sglang_root: Path) -> None:
    table = Table(title="SGLang's scheduler loop beside the bench", show_lines=True)
    for column in ("SGLang scheduler step", "file:lines", "bench step", "what the bench leaves out"):
        table.add_column(column)
    for qualname, path, bench_step, left_out in SCHEDULER_STEPS:
        piece = find_piece(sglang_root, path, qualname)
        where = f"{path}:{piece.start}-{piece.end}" if piece else f"{path} (missing)"
        table.add_row(qualname, where, (bench_step or "-").removeprefix("minisgl."), left_out)
    console.print(table)


def check_all(sglang_root: Path) -> list[str]:
    from reader import site

    index, _ = _load(str(PACKAGE_DIR.resolve()))
    names = {name: {n.qname for n in build_chain(name).root.walk()} for name in ENTRIES}
    return check(index, names, sglang_root) + site.stale(sglang_root)
