"""``python -m reader chain latency|correctness|profile``: print a call chain as a tree.

Each line is the callee's qualified name (the ``minisgl.`` prefix dropped) and ``file:start-end``; a
``[via]`` tag says how the call was resolved when it is not a plain call. Unresolved calls are listed
at the end. Bad input prints one ``error: ...`` line on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.tree import Tree

from reader.chains import ENTRIES, Chain, Node, build_chain

MAX_UNRESOLVED = 40


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _label(node: Node, root: Path) -> str:
    try:
        path = node.file.relative_to(root)
    except ValueError:
        path = node.file
    name = node.qname.removeprefix("minisgl.")
    tags = [t for t in (node.via if node.via not in ("call", "entry") else "", node.marker) if t]
    tag = f" [magenta]\\[{', '.join(tags)}][/]" if tags else ""
    return f"[bold]{escape(name)}[/]{tag} [dim]{escape(str(path))}:{node.start}-{node.end}[/]"


def render(chain: Chain, console: Console, root: Path) -> None:
    """Print ``chain`` as a rich tree, then its unresolved calls."""

    def add(tree: Tree, node: Node) -> None:
        branch = tree.add(_label(node, root))
        for child in node.children:
            add(branch, child)

    top = Tree(_label(chain.root, root))
    for child in chain.root.children:
        add(top, child)
    console.print(top)
    unique = list(dict.fromkeys(chain.unresolved))
    console.print(
        f"\n[bold]unresolved[/] ({len(unique)} calls; {len(chain.external)} external calls not shown)", soft_wrap=True
    )
    for caller, text, line in unique[:MAX_UNRESOLVED]:
        console.print(f"  {escape(caller.removeprefix('minisgl.'))}:{line}  {escape(text)}", soft_wrap=True)
    if len(unique) > MAX_UNRESOLVED:
        console.print(f"  ... {len(unique) - MAX_UNRESOLVED} more (first {MAX_UNRESOLVED} shown)", soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m reader", description="Read minisgl's source: call chains.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_chain = sub.add_parser("chain", help="print a call chain from a bench entry point")
    p_chain.add_argument("name", help=f"one of: {', '.join(ENTRIES)}")
    args = parser.parse_args(argv)
    if args.name not in ENTRIES:
        print(f"error: unknown chain {args.name!r}; choose one of {', '.join(ENTRIES)}", file=sys.stderr)
        return 2
    chain = build_chain(args.name)
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=200)
    render(chain, console, Path.cwd())
    return 0


if __name__ == "__main__":
    sys.exit(main())
