"""SGLang's real source, read and never imported: fetch the pinned release, find a qualified name in it.

``ensure_sglang_source()`` downloads the sglang 0.5.14 wheel with ``pip download --no-deps`` (once,
into ``$MINISGL_CACHE/sglang-0.5.14``) and unpacks its ``.py`` files; ``--sglang-src PATH`` takes a
checkout (``python/sglang``), an unpacked wheel or a site-packages directory instead.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import libcst as cst

from minisgl.utils.common import cache_dir
from reader.counterparts import SGLANG_VERSION


class ReaderError(Exception):
    """Bad input to the reader (a name, a path, a file that does not parse): one line, exit code 2."""


def _cache_dir() -> Path:
    return cache_dir() / f"sglang-{SGLANG_VERSION}"


def fetch_command(dest: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--implementation", "cp",
            "--python-version", "3.11", "--platform", "manylinux_2_34_x86_64", f"sglang=={SGLANG_VERSION}",
            "-d", str(dest)]  # fmt: skip


def ensure_sglang_source(sglang_src: str | None = None) -> Path:
    """The directory that contains the ``sglang`` package's source."""
    if sglang_src is not None:
        return resolve_sglang_root(Path(sglang_src))
    root = _cache_dir() / "src"
    if (root / "sglang" / "bench_one_batch.py").exists():
        return root
    wheels = _cache_dir() / "wheels"
    if not list(wheels.glob("sglang-*.whl")):
        result = subprocess.run(fetch_command(wheels), capture_output=True, text=True)
        if result.returncode != 0:
            raise ReaderError(f"cannot download sglang {SGLANG_VERSION}; run: {' '.join(fetch_command(wheels))}")
    wheel = next(wheels.glob("sglang-*.whl"))
    # Unpack into a temporary directory, then rename: an interrupted run never leaves half a tree.
    tmp = Path(tempfile.mkdtemp(dir=_cache_dir()))
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp, [n for n in zf.namelist() if n.startswith("sglang/") and n.endswith(".py")])
    os.replace(tmp, root)
    return root


def resolve_sglang_root(path: Path) -> Path:
    for candidate in (path, path / "python", path.parent):
        if (candidate / "sglang" / "__init__.py").exists():
            return candidate
    raise ReaderError(
        f"--sglang-src {path}: no sglang package there; pass a checkout, an unpacked wheel or site-packages"
    )


@dataclass(frozen=True)
class SourcePiece:
    qualname: str
    path: str  # relative to the source root, e.g. sglang/srt/managers/schedule_batch.py
    start: int
    end: int
    code: str
    node: cst.CSTNode


@lru_cache(maxsize=512)
def _spans(file: Path) -> dict[str, tuple[int, int]]:
    """``Class.method`` / ``function`` -> (first line incl. decorators, last line), for a whole file.

    Located with the standard library's fast C parser; only the piece itself then goes through libcst,
    which would take seconds on SGLang's largest files.
    """
    try:
        tree = ast.parse(file.read_text())
    except (SyntaxError, UnicodeDecodeError) as e:
        raise ReaderError(f"{file} does not parse: {str(e).splitlines()[0]}") from None
    spans: dict[str, tuple[int, int]] = {}

    def visit(body, prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                spans.setdefault(prefix + node.name, (first, node.end_lineno))
                if isinstance(node, ast.ClassDef):
                    visit(node.body, f"{prefix}{node.name}.")

    visit(tree.body, "")
    return spans


def find_piece(root: Path, rel_path: str, qualname: str) -> SourcePiece | None:
    """The definition of ``qualname`` (``Class.method`` or ``function``) in ``root/rel_path``, or None."""
    file = root / rel_path
    if not file.exists():
        return None
    span = _spans(file).get(qualname)
    if span is None:
        return None
    code = "\n".join(file.read_text().splitlines()[span[0] - 1 : span[1]])
    try:
        node = cst.parse_module(textwrap.dedent(code) + "\n").body[0]
    except cst.ParserSyntaxError as e:
        raise ReaderError(f"{file}:{span[0]} does not parse: {str(e).splitlines()[0]}") from None
    return SourcePiece(qualname, rel_path, span[0], span[1], code, node)
