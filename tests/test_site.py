"""The study site: generated pages match the source, the strict build passes offline, every link and
anchor resolves, and nothing points outside the site.

External URLs: no ``href``/``src``/CSS ``url()`` may leave the site, and no ``http(s)://`` text may
appear in built HTML outside ``<pre>`` blocks (SVG/XML namespaces excepted). Source code shown in
``<pre>`` (and therefore in the search index) may mention URLs in its comments; those are text, not
references, and the search index may hold no URL that is not in such a code block. Vendored and
Material's bundled JavaScript are not scanned as text (their strings name CDNs that are never used,
because mermaid and the iframe-worker shim are served locally)."""

from __future__ import annotations

import re
import shutil
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("material")

from reader import site  # noqa: E402
from reader.sglang_source import ensure_sglang_source  # noqa: E402

URL = re.compile(r"https?://[^\s\"'<>)\\]+")
CLICK = re.compile(r'click \w+ href (?:&quot;([^&]+)&quot;|"([^"]+)")')
NAMESPACES = ("http://www.w3.org/", "http://www.sitemaps.org/")


@pytest.fixture(scope="session")
def sglang_root() -> Path:
    return ensure_sglang_source(None)


@pytest.fixture(scope="session")
def built(tmp_path_factory, sglang_root) -> tuple[Path, Path]:
    """(docs copy, built site): main() regenerates a copy of docs/ and builds it strictly."""
    tmp = tmp_path_factory.mktemp("site")
    docs = tmp / "docs"
    shutil.copytree(site.DOCS, docs, ignore=shutil.ignore_patterns("vendor"))
    site.main(sglang_root, build=True, docs_dir=docs, site_dir=tmp / "site")
    return docs, tmp / "site"


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.links, self.pre_depth, self.text = set(), [], 0, []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        for key in ("href", "src"):
            if attrs.get(key):
                self.links.append((tag, attrs[key]))
        if tag == "pre":
            self.pre_depth += 1

    def handle_endtag(self, tag):
        if tag == "pre":
            self.pre_depth = max(0, self.pre_depth - 1)

    def handle_data(self, data):
        if not self.pre_depth:
            self.text.append(data)


def _pages(site_dir: Path) -> dict[Path, _Page]:
    pages = {}
    for path in site_dir.rglob("*.html"):
        page = _Page()
        page.feed(path.read_text())
        page.raw = path.read_text()
        pages[path] = page
    return pages


def test_committed_pages_are_current(sglang_root):
    assert site.stale(sglang_root) == [], "run: python -m reader site"


def test_stale_detects_edits_and_renames(built, sglang_root):
    docs, _ = built
    assert site.stale(sglang_root, docs) == []
    page = docs / "reference/pieces/minisgl.managers.schedule_batch.ScheduleBatch.prepare_for_extend.md"
    text = page.read_text()
    page.write_text(text + "\nhand edit\n")
    assert any("prepare_for_extend" in p and "out of date" in p for p in site.stale(sglang_root, docs))
    page.write_text(text)
    renamed = page.with_name("minisgl.managers.schedule_batch.ScheduleBatch.prepare_for_extend_old.md")
    page.rename(renamed)  # what a renamed piece leaves behind: an old page, a missing new one
    problems = site.stale(sglang_root, docs)
    assert any("prepare_for_extend_old" in p and "no longer generated" in p for p in problems)
    assert any("prepare_for_extend.md: missing" in p for p in problems)
    site.write_pages(sglang_root, docs)
    assert not renamed.exists() and site.stale(sglang_root, docs) == []


def test_pages_are_named_by_qualified_name(built):
    docs, site_dir = built
    name = "minisgl.managers.schedule_batch.ScheduleBatch.prepare_for_extend"
    html = (site_dir / f"reference/pieces/{name}.html").read_text()
    assert f'id="{name}"' in html
    assert 'class="tabbed-set' in html and "SGLang 0.5.14" in html
    assert "sglang v0.5.14: python/sglang/srt/managers/schedule_batch.py:L" in html
    chain = (docs / "reference/chains/latency.md").read_text()
    assert "```mermaid" in chain and f"pieces/{name}.md#{name}" in chain


def test_links_and_anchors_resolve(built):
    _, site_dir = built
    pages = _pages(site_dir)
    broken = []
    for path, page in pages.items():
        hrefs = [link for _, link in page.links]
        hrefs += [a or b for a, b in CLICK.findall(page.raw)]  # mermaid node links
        for href in hrefs:
            parts = urlsplit(href)
            if parts.scheme in ("data", "mailto", "javascript") or (not parts.path and not parts.fragment):
                continue
            if parts.scheme or parts.netloc:
                broken.append(f"{path.relative_to(site_dir)}: external {href}")
                continue
            base = site_dir if parts.path.startswith("/") else path.parent  # 404.html is root-absolute
            target = (base / unquote(parts.path).lstrip("/")).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{path.relative_to(site_dir)}: {href} (no file)")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else set()
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{path.relative_to(site_dir)}: {href} (no anchor)")
    assert not broken, "\n".join(broken[:20])


def test_no_external_urls(built):
    _, site_dir = built
    bad = []
    code_urls = set()
    for path, page in _pages(site_dir).items():
        code_urls |= set(URL.findall(page.raw))
        bad += [f"{path.name}: {u}" for u in URL.findall(" ".join(page.text)) if not u.startswith(NAMESPACES)]
        bad += [f"{path.name}: <{t} {u}>" for t, u in page.links if URL.match(u)]
    for css in site_dir.rglob("*.css"):
        bad += [f"{css.name}: url({u})" for u in re.findall(r"url\(\s*['\"]?(https?://[^)'\"]+)", css.read_text())]
    index = (site_dir / "search/search_index.js").read_text().replace("\\/", "/")
    bad += [f"search index: {u}" for u in URL.findall(index) if not any(u.rstrip("\\n") in c for c in code_urls)]
    bad += [
        f"sitemap: {u}" for u in URL.findall((site_dir / "sitemap.xml").read_text()) if not u.startswith(NAMESPACES)
    ]
    assert not bad, "\n".join(bad[:20])


def test_bench_targets_report_the_worst_row_of_each():
    from reader.site_bench import _targets

    def row(model, dtype, batch, floor, speedup, peak, compiled_floor):
        return {"model": model, "dtype": dtype, "batch": batch, "input": 128, "output": 32, "minisgl_prefill_s": {},
                "minisgl_decode_floor_share": floor, "decode_speedup": speedup, "prefill_speedup": 1.2,
                "minisgl_prefill_peak_share": peak, "compiled_prefill_s": {},
                "compiled_decode_floor_share": compiled_floor, "compiled_decode_speedup": speedup + 1,
                "compiled_prefill_speedup": 1.3, "compiled_prefill_peak_share": peak}  # fmt: skip

    rows = [row("a", "float32", 1, 0.90, 1.5, 0.80, 0.95), row("b", "float32", 1, 0.60, 1.4, 0.90, 0.88),
            row("a", "bfloat16", 8, 0.30, 2.5, 0.55, 0.5), row("b", "float32", 8, 0.40, 0.9, 0.76, 0.5)]  # fmt: skip
    lines = {}
    for line in _targets(rows)[1:]:
        name, engine = line.split(" | ")[:2]
        lines[name.lstrip("| "), engine] = line
    floor = "decode at batch 1, float32: share of the bandwidth floor"
    assert "| b float32 1,128,32 | 60% | no |" in lines[floor, "minisgl"]
    assert "| b float32 1,128,32 | 88% | yes |" in lines[floor, "minisgl --enable-torch-compile"]
    assert "| b float32 8,128,32 | 0.90x | no |" in lines["decode at batch 8: speedup over HF", "minisgl"]
    assert "| b float32 8,128,32 | 1.90x | no |" in lines["decode at batch 8: speedup over HF",
                                                          "minisgl --enable-torch-compile"]  # fmt: skip
    assert "| b float32 8,128,32 | 76% | yes |" in lines["prefill, float32: share of the matmul peak", "minisgl"]
    assert "| a bfloat16 8,128,32 | 55% | yes |" in lines["prefill, bfloat16: share of the matmul peak", "minisgl"]
    assert "| b float32 8,128,32 | 0.90x | no |" in lines["every row: decode speedup over HF", "minisgl"]


def test_bench_decode_breakdown_splits_each_step_at_the_linears():
    from reader.site_bench import _decode_breakdown

    row = {"model": "m", "dtype": "float32", "batch": 1, "input": 128, "output": 32, "minisgl_prefill_s": {},
           "compiled_prefill_s": {}, "decode_bytes": 400e6, "read_bandwidth_bytes": 40e9, "matmul_peak_flops": 100e9,
           "decode_linears_s": {"median": 0.020},
           "decode_linears_read_rate": 400e6 / 0.020,
           "decode_linears_flop_rate": 2 * 1 * 100e6 / 0.020, "minisgl_decode_s": {"median": 0.030},
           "compiled_decode_s": {"median": 0.025}}  # fmt: skip
    lines = _decode_breakdown([row, {**row, "decode_kv_bytes": 100e6}])
    assert "minisgl step ms (rest)" in lines[0] and "minisgl --enable-torch-compile step ms (rest)" in lines[0]
    assert "| floor ms | K/V read ms |" in lines[0]
    # the row's own bandwidth and peak: floor 400 MB / 40 GB/s = 10 ms; the linears read at 20 GB/s, half
    # the bandwidth, and do 2 * 1e8 float32 weights * 1 row in 20 ms = 10 GFLOP/s, a tenth of the peak;
    # rest = step - 20 ms. Results from before the K/V count leave its cell empty; 100 MB of cache is 2.5 ms.
    assert lines[1] == (
        "| m | float32 | 1, 128, 32 | 40 | 10.0 | - | 20.0 | 20.0 GB/s (50%) | 10 GFLOP/s (10%) | 30.0 (10.0) | 25.0 (5.0) |\n"
    )
    assert lines[2] == lines[1].replace("| - |", "| 2.5 |")


def test_bench_prefill_breakdown_splits_each_prefill_at_linears_and_attention():
    from reader.site_bench import _prefill_breakdown

    row = {"model": "m", "dtype": "bfloat16", "batch": 1, "input": 512, "output": 16, "matmul_peak_flops": 200e9,
           "prefill_linears_s": {"median": 0.300}, "prefill_attention_s": {"median": 0.100},
           "prefill_linears_flop_rate": 30e9 / 0.300, "prefill_attention_flop_rate": 10e9 / 0.100,
           "prefill_ceiling_share": 40e9 / 0.400 / 200e9,
           "minisgl_prefill_s": {"median": 0.500}, "compiled_prefill_s": {"median": 0.380}}  # fmt: skip
    lines = _prefill_breakdown([row])
    assert "| ceiling | minisgl prefill ms (rest) | minisgl --enable-torch-compile prefill ms (rest) |" in lines[0]
    # the row's own peak: linears 100 GFLOP/s of 200, attention 100 of 200; 40 GFLOP in 400 ms is half the
    # peak; rest = prefill - 400 ms, below zero where the engine beats the parts' sum
    assert lines[1] == ("| m | bfloat16 | 1, 512, 16 | 200 | 300.0 | 100 GFLOP/s (50%) | 100.0 | 100 GFLOP/s (50%) | 50% "
                        "| 500.0 (100.0) | 380.0 (-20.0) |\n")  # fmt: skip


def test_bench_page_shows_the_cuda_run_beside_the_cpu_one(tmp_path, monkeypatch):
    """bench/results-cuda.json, when there, gets its own section with the GPU it ran on and its rows' figures, and
    each further results-cuda-*.json a heading of its own there; without any the section says how to make one."""
    import json

    from reader import site_bench

    monkeypatch.setattr(site_bench, "RESULTS_CUDA", tmp_path / "results-cuda.json")
    page = site_bench.bench_pages()["reference/bench.md"]
    assert "## On CUDA" in page and site_bench.CUDA_COMMAND in page and "measured on NVIDIA" not in page
    data = json.loads(site_bench.RESULTS.read_text())
    (tmp_path / "results-cuda.json").write_text(json.dumps({**data, "device": "cpu"}))  # DEVICE=cpu's rehearsal
    page = site_bench.bench_pages()["reference/bench.md"]
    assert "holds a run on cpu, not on CUDA" in page and "measured on" not in page.split("## On CUDA")[1]
    data["device"] = "cuda"
    data.pop("commit", None)
    data["machine"].update(gpu="NVIDIA H200", cuda="13.0", torch="2.11.0+cu130")
    data["rows"][0]["minisgl_prefill_s"].update(median=0.0123, min=0.0111, max=0.0135)
    (tmp_path / "results-cuda.json").write_text(json.dumps(data))
    cpu, cuda = site_bench.bench_pages()["reference/bench.md"].split("## On CUDA")
    assert "measured on NVIDIA H200 (CUDA 13.0, torch 2.11.0+cu130)" in cuda
    assert "commit" not in cuda.split("measured on")[0]  # a device machine's copy has no git history
    data["commit"] = "abc1234+changes"
    (tmp_path / "results-cuda.json").write_text(json.dumps(data))
    cuda = site_bench.bench_pages()["reference/bench.md"].split("## On CUDA")[1]
    assert "The minisgl commit measured: `abc1234` with uncommitted changes." in cuda
    assert "| 12.3 [11.1-13.5] |" in cuda and "| 12.3 [11.1-13.5] |" not in cpu
    model = data["rows"][0]["model"]  # each of its rows once in each engine's table
    expected = len(site_bench._engines(data["rows"])) * sum(r["model"] == model for r in data["rows"])
    assert cuda.count(f"| {model} |") == expected
    # the decode linears' graph replay against the step: 10 ms of a 20 ms step is half of it
    for r in data["rows"]:
        r["decode_linears_s"]["median"] = 0.010
        for engine in site_bench._engines(data["rows"]):
            r[f"{engine}_decode_s"]["median"] = 0.020
    (tmp_path / "results-cuda.json").write_text(json.dumps(data))
    cuda = site_bench.bench_pages()["reference/bench.md"].split("## On CUDA")[1]
    assert "take 50%-50% of minisgl's step" in cuda and "minisgl ran every decode eagerly here" in cuda
    (tmp_path / "results-cuda.json").write_text(json.dumps({**data, "minisgl_cuda_graph": True}))
    cuda = site_bench.bench_pages()["reference/bench.md"].split("## On CUDA")[1]
    assert "take 50%-50% of minisgl's step" in cuda and "minisgl replays each decode step from a CUDA graph" in cuda
    assert "eagerly" not in cuda
    (tmp_path / "results-cuda.json").write_text(json.dumps(data))
    # a second run beside it (a compiled run of one model, say): each under its own heading, the full run first
    (tmp_path / "results-cuda-compiled.json").write_text(json.dumps({**data, "rows": data["rows"][:1]}))
    cuda = site_bench.bench_pages()["reference/bench.md"].split("## On CUDA")[1]
    full, extra = cuda.index("### `bench/results-cuda.json`"), cuda.index("### `bench/results-cuda-compiled.json`")
    assert full < extra and cuda.count("measured on NVIDIA H200") == 2
    assert cuda[extra:].count(f"| {model} |") == len(site_bench._engines(data["rows"]))


def test_bench_page_shows_runs_on_other_cpus_with_their_own_targets(tmp_path, monkeypatch):
    """Each bench/results-cpu-*.json gets a heading with its machine (float32 copies named where the run recorded
    them), the targets against its own rows and each engine's table; none: no section; a GPU run there: not
    shown."""
    import json

    from reader import site_bench

    data = json.loads(site_bench.RESULTS.read_text())
    monkeypatch.setattr(site_bench, "RESULTS", tmp_path / "results.json")
    site_bench.RESULTS.write_text(json.dumps(data))
    assert "## On other CPUs" not in site_bench.bench_pages()["reference/bench.md"]
    other = json.loads(json.dumps(data))
    other["machine"].update(cpu="AMD EPYC 7B13", capability="AVX2", avx512_bf16=False, bfloat16_float32_copies=True)
    other["rows"][0]["minisgl_prefill_s"].update(median=0.0456, min=0.0444, max=0.0468)
    batch_one = next(r for r in other["rows"] if r["batch"] == 1 and r["dtype"] == "float32")
    batch_one["minisgl_decode_floor_share"] = 0.031  # the worst batch-1 float32 decode share now
    (tmp_path / "results-cpu-avx2.json").write_text(json.dumps(other))
    page = site_bench.bench_pages()["reference/bench.md"]
    main, rest = page.split("## On other CPUs")
    section = rest.split("## On CUDA")[0]
    assert "### `bench/results-cpu-avx2.json`" in section and "Measured on: AMD EPYC 7B13" in section
    assert "multiply batched rows through float32 copies" in section and "float32 copies" not in main
    assert any(r["dtype"] == "bfloat16" for r in other["rows"])
    float32_only = {**other, "rows": [r for r in other["rows"] if r["dtype"] == "float32"]}
    assert "float32 copies" not in site_bench._machine(float32_only["machine"], float32_only["rows"])
    # A VM's model name may say only "AMD EPYC": where perf.py recorded the CPU family and model, they are shown.
    named = {**other["machine"], "cpu": "AMD EPYC", "cpu_family": "26", "cpu_model": "2"}
    assert "Measured on: AMD EPYC (family 26, model 2), " in site_bench._machine(named)
    before = {k: v for k, v in other["machine"].items() if k not in ("cpu_family", "cpu_model")}
    assert "Measured on: AMD EPYC 7B13, " in site_bench._machine(before)  # results written before perf.py kept them
    assert "| 45.6 [44.4-46.8] |" in section and "| 45.6 [44.4-46.8] |" not in main
    assert "| 3% | no |" in section and "| 3% | no |" not in main
    model, engines = other["rows"][0]["model"], site_bench._engines(other["rows"])
    assert section.count(f"| {model} |") == len(engines) * sum(r["model"] == model for r in other["rows"])
    (tmp_path / "results-cpu-avx2.json").write_text(json.dumps({**other, "device": "cuda"}))
    section = site_bench.bench_pages()["reference/bench.md"].split("## On other CPUs")[1].split("## On CUDA")[0]
    assert "holds a run on cuda, not on a CPU: not shown" in section and f"| {model} |" not in section


@pytest.mark.parametrize(("padded_rows", "copies", "expected"), [
    (1, False, "1-3 decode rows not padded for oneDNN; column-blocked copies for MKL's single-row GEMV in float32: no."),
    (4, True, "1-3 decode rows padded to 4 for oneDNN; column-blocked copies for MKL's single-row GEMV in float32: yes."),
    (1, {"float32": True, "bfloat16": False}, "1-3 decode rows not padded for oneDNN; column-blocked copies for "
     "minisgl's C++ kernel at decode's few rows: float32 yes, bfloat16 no."),
])  # fmt: skip
def test_bench_page_names_the_probes_choices(padded_rows, copies, expected):
    """Results written before the C++ kernel recorded MKL's single-row copies (a bool), later ones the kernel's
    copies per dtype: the page names whichever the results hold."""
    from reader.site_bench import _machine

    key = "blocked_copies" if isinstance(copies, dict) else "mkl_gemv_copies"
    machine = {"cpu": "AMD EPYC", "cores": 2, "torch_threads": 2, "capability": "AVX512", "amx": False,
               "avx512_bf16": True, "padded_rows": padded_rows, key: copies}  # fmt: skip
    assert expected in _machine(machine)
    assert "probes" not in _machine({k: v for k, v in machine.items() if k not in ("padded_rows", key)})
    assert "MKL's GEMM" not in _machine(machine)  # results written before the GEMM copies have no answer
    if isinstance(copies, dict):  # recorded since the probe picks the distance
        for ahead, words in ((4096, "prefetched 4 KiB ahead"), (0, "prefetched not at all")):
            prefetch = _machine({**machine, "single_row_prefetch": ahead})
            assert f"float32 yes, bfloat16 no, a single row's weights {words}." in prefetch
    gemm = _machine({**machine, "mkl_gemm_copies": padded_rows == 4, "mkl_gemm_min_rows": 512})
    assert (
        f"Plain float32 weights kept for MKL's GEMM on prefills of 512 rows or more: {'yes' if padded_rows == 4 else 'no'}."
        in gemm
    )


def test_bench_page_gives_the_span_of_the_rows_peak_samples():
    from reader.site_bench import _peak_samples

    rows = [{"dtype": "float32", "matmul_peak_samples": [150e9, 210e9]},
            {"dtype": "bfloat16", "matmul_peak_samples": [400e9]},
            {"dtype": "float32", "matmul_peak_samples": [120e9, 200e9]}]  # fmt: skip
    assert _peak_samples(rows) == "float32 120-210 GFLOP/s, bfloat16 400-400 GFLOP/s"


@pytest.mark.parametrize(("flags", "warmed", "one_process"), [
    ({"process_per_engine": True, "warm_up_before_each_run": True}, True, False),
    ({"process_per_engine": True}, False, False),  # results from before perf.py warmed each run up
    ({}, False, True),  # from before it ran each engine apart
])  # fmt: skip
def test_bench_page_says_how_each_run_was_timed(flags, warmed, one_process):
    from reader.site_bench import _processes

    text = _processes(flags)
    assert ("untimed prefill of the same workload" in text) == warmed
    assert ("all engines in one process" in text) == one_process
    assert "engines alternating between repetitions" in text
