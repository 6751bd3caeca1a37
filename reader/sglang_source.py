"""SGLang's real source, read and never imported: fetch the pinned release, find a qualified name in it.

``ensure_sglang_source()`` downloads the sglang 0.5.14 wheel with ``pip download --no-deps`` (once,
into ``$MINISGL_CACHE/sglang-0.5.14``) and unpacks its ``.py`` files; ``--sglang-src PATH`` takes a
checkout (``python/sglang``), an unpacked wheel or a site-packages directory instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from reader.counterparts import SGLANG_VERSION


class ReaderError(Exception):
    """Bad input to the reader (a name, a path, a file that does not parse): one line, exit code 2."""


def _cache_dir() -> Path:
    return Path(os.environ.get("MINISGL_CACHE", Path.home() / ".cache" / "minisgl")) / f"sglang-{SGLANG_VERSION}"


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


@lru_cache(maxsize=256)
def _parse(file: Path) -> tuple[MetadataWrapper, dict]:
    try:
        wrapper = MetadataWrapper(cst.parse_module(file.read_text()))
    except (cst.ParserSyntaxError, UnicodeDecodeError) as e:
        raise ReaderError(f"{file} does not parse: {str(e).splitlines()[0]}") from None
    return wrapper, wrapper.resolve(PositionProvider)


def _find(body, parts: list[str]):
    for stmt in body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) and stmt.name.value == parts[0]:
            if len(parts) == 1:
                return stmt
            if isinstance(stmt, cst.ClassDef):
                return _find(stmt.body.body, parts[1:])
    return None


def find_piece(root: Path, rel_path: str, qualname: str) -> SourcePiece | None:
    """The definition of ``qualname`` (``Class.method`` or ``function``) in ``root/rel_path``, or None."""
    file = root / rel_path
    if not file.exists():
        return None
    wrapper, positions = _parse(file)
    node = _find(wrapper.module.body, qualname.split("."))
    if node is None:
        return None
    pos = positions[node]
    lines = file.read_text().splitlines()[pos.start.line - 1 : pos.end.line]
    return SourcePiece(qualname, rel_path, pos.start.line, pos.end.line, "\n".join(lines), node)
