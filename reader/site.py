"""The study site: regenerate ``docs/reference/`` from the source, check it for drift, build it offline.

``python -m reader site --build`` writes the generated pages, copies the vendored JavaScript (mermaid
and the iframe-worker shim, fetched once from the npm registry with ``npm pack`` into the cache) into
``docs/assets/vendor/``, then runs ``mkdocs build --strict`` into ``site/``. The built site needs no
network: fonts off, search index inlined by Material's ``offline`` plugin, mermaid served locally.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from minisgl.utils.common import cache_dir
from reader.sglang_source import ReaderError
from reader.site_pages import render_all
from reader.views import REPO_ROOT

DOCS = REPO_ROOT / "docs"
GENERATED = "reference"  # the only folder under docs/ that is written by this module
CONFIG = REPO_ROOT / "mkdocs.yml"
# npm package -> (file inside the tarball, name under docs/assets/vendor/)
ASSETS = {
    "mermaid@11.17.2": ("package/dist/mermaid.min.js", "mermaid.min.js"),
    "iframe-worker@1.0.4": ("package/shim/index.js", "iframe-worker-shim.js"),
}


def _asset_cache() -> Path:
    return cache_dir() / "site-assets"


def render_pages(sglang_root: Path) -> dict[str, str]:
    """Relative path under docs/ -> Markdown, for every generated page."""
    return render_all(sglang_root)


def _existing(docs_dir: Path) -> dict[str, Path]:
    root = docs_dir / GENERATED
    files = sorted(p for p in root.rglob("*") if p.suffix in (".md", ".svg")) if root.exists() else []
    return {str(p.relative_to(docs_dir)): p for p in files}


def stale(sglang_root: Path, docs_dir: Path = DOCS) -> list[str]:
    """Problem lines; empty when docs/ holds exactly what ``render_pages`` would write."""
    pages, existing = render_pages(sglang_root), _existing(docs_dir)
    problems = []
    for rel, text in pages.items():
        if rel not in existing:
            problems.append(f"docs/{rel}: missing; run python -m reader site")
        elif existing[rel].read_text() != text:
            problems.append(f"docs/{rel}: out of date or edited by hand; run python -m reader site")
    problems += [f"docs/{rel}: no longer generated; run python -m reader site" for rel in existing if rel not in pages]
    return problems


def write_pages(sglang_root: Path, docs_dir: Path = DOCS) -> int:
    """Write the generated pages, remove those that are no longer generated; the number of files changed."""
    pages, changed = render_pages(sglang_root), 0
    for rel, path in _existing(docs_dir).items():
        if rel not in pages:
            path.unlink()
            changed += 1
    for rel, text in pages.items():
        path = docs_dir / rel
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed += 1
    for folder in sorted((docs_dir / GENERATED).rglob("*"), reverse=True):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    return changed


def fetch_assets(docs_dir: Path = DOCS) -> Path:
    """Copy the vendored JS into docs/assets/vendor/, fetching the npm tarballs once into the cache."""
    cache, vendor = _asset_cache(), docs_dir / "assets" / "vendor"
    cache.mkdir(parents=True, exist_ok=True)
    vendor.mkdir(parents=True, exist_ok=True)
    for spec, (member, dest) in ASSETS.items():
        name, version = spec.rsplit("@", 1)
        tgz = cache / f"{name}-{version}.tgz"
        if not tgz.exists():
            if not shutil.which("npm"):
                raise ReaderError(f"{tgz} is missing and npm is not installed to fetch {spec}")
            proc = subprocess.run(["npm", "pack", spec, "--silent", "--pack-destination", str(cache)],
                                  capture_output=True, text=True)  # fmt: skip
            if proc.returncode != 0 or not tgz.exists():
                raise ReaderError(f"npm pack {spec} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
        target = vendor / dest
        if not target.exists() or target.stat().st_mtime < tgz.stat().st_mtime:
            with tarfile.open(tgz) as tar:
                data = tar.extractfile(member)
                if data is None:
                    raise ReaderError(f"{member} is not in {tgz}")
                target.write_bytes(data.read())
    return vendor


def build_site(site_dir: Path, docs_dir: Path = DOCS) -> None:
    """``mkdocs build --strict`` of ``docs_dir`` into ``site_dir``; a ReaderError with the first problem."""
    fetch_assets(docs_dir)
    config = CONFIG
    if docs_dir.resolve() != DOCS.resolve():  # a copy of docs/ elsewhere (tests): same config, other folder
        config = site_dir.parent / f".mkdocs-{site_dir.name}.yml"
        text = CONFIG.read_text().replace("docs_dir: docs\n", f"docs_dir: {docs_dir.resolve()}\n")
        config.write_text(text)
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", DISABLE_MKDOCS_2_WARNING="true")
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(config), "-d", str(site_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO_ROOT)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if "WARNING" in ln or "ERROR" in ln]
        first = (lines or (proc.stderr + proc.stdout).strip().splitlines() or ["no output"])[0]
        extra = f" (+{len(lines) - 1} more)" if len(lines) > 1 else ""
        raise ReaderError(f"mkdocs build --strict failed: {first.strip()}{extra}")


def main(sglang_root: Path, build: bool = False, docs_dir: Path = DOCS, site_dir: Path | None = None) -> None:
    changed = write_pages(sglang_root, docs_dir)
    print(f"docs/{GENERATED}: {changed} files changed")
    if build:
        site_dir = site_dir or REPO_ROOT / "site"
        build_site(site_dir, docs_dir)
        print(f"site built into {site_dir}")
