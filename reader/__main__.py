"""``python -m reader chain|show|diff|scheduler|check|site``: read minisgl beside SGLang 0.5.14.

``chain NAME`` prints a bench mode's call chain as a tree; ``show NAME`` a piece beside its SGLang
counterpart with its callers and callees; ``diff NAME`` what the counterpart adds; ``scheduler`` the
scheduler loop beside the bench steps; ``check`` exits 1 listing drift; ``site`` regenerates the study site.

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

from minisgl.bench_utils import OneLineErrorParser
from reader import views
from reader.chains import ENTRIES, Chain, Node, build_chain
from reader.sglang_source import ReaderError, ensure_sglang_source

MAX_UNRESOLVED = 40


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
    parser = OneLineErrorParser(prog="python -m reader", description="Read minisgl beside SGLang 0.5.14.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_chain = sub.add_parser("chain", help="print a call chain from a bench entry point")
    p_chain.add_argument("name", help=f"one of: {', '.join(ENTRIES)}")
    for name, text in (("show", "a piece beside its SGLang counterpart"), ("diff", "what SGLang's counterpart adds")):
        p = sub.add_parser(name, help=text)
        p.add_argument("name", help="qualified or short name, e.g. prepare_for_extend")
    sub.add_parser("scheduler", help="SGLang's scheduler loop beside the bench steps")
    sub.add_parser("check", help="exit 1 when mappings, SGLang source or generated docs drifted")
    p_site = sub.add_parser("site", help="regenerate the study site pages (and build it with --build)")
    p_site.add_argument("--build", action="store_true", help="also run mkdocs build --strict")
    for p in sub.choices.values():
        p.add_argument("--sglang-src", default=None, help="SGLang source (checkout, unpacked wheel, site-packages)")
    args = parser.parse_args(argv)
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=200)
    try:
        return _run(args, console)
    except ReaderError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, console: Console) -> int:
    if args.cmd == "chain":
        if args.name not in ENTRIES:
            raise ReaderError(f"unknown chain {args.name!r}; choose one of {', '.join(ENTRIES)}")
        render(build_chain(args.name), console, Path.cwd())
        return 0
    sglang_root = ensure_sglang_source(args.sglang_src)
    if args.cmd in ("show", "diff"):
        views.show(console, sglang_root, args.name, diff_only=args.cmd == "diff")
        return 0
    if args.cmd == "scheduler":
        views.scheduler(console, sglang_root)
        return 0
    if args.cmd == "site":
        from reader import site

        site.main(sglang_root, build=args.build)
        return 0
    problems = views.check_all(sglang_root)
    for problem in problems:
        console.print(escape(problem), soft_wrap=True)
    if problems:
        console.print(f"[bold red]{len(problems)} problems[/]")
        return 1
    console.print("reader check: mappings, SGLang source and generated docs agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
