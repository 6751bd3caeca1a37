"""reader's mapping commands against SGLang 0.5.14's real source (downloaded once, cached)."""

from __future__ import annotations

import shutil

import pytest

from reader.__main__ import main
from reader.chains import ENTRIES, PACKAGE_DIR, _load, build_chain
from reader.counterparts import COUNTERPARTS
from reader.pieces import check, counterpart_of
from reader.sglang_source import ensure_sglang_source, find_piece


@pytest.fixture(scope="module")
def sglang_root():
    return ensure_sglang_source()


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_every_chain_piece_is_mapped_and_every_counterpart_exists(sglang_root):
    index, _ = _load(str(PACKAGE_DIR.resolve()))
    names = {name: {n.qname for n in build_chain(name).root.walk()} for name in ENTRIES}
    assert check(index, names, sglang_root) == []
    assert counterpart_of("minisgl.managers.schedule_batch.ScheduleBatch.prepare_for_extend").qualname == (
        "ScheduleBatch.prepare_for_extend"
    )


def test_counterpart_source_is_the_real_definition(sglang_root):
    qualname, path = COUNTERPARTS["minisgl.bench_one_batch.latency_test_run_once"]
    piece = find_piece(sglang_root, path, qualname)
    assert piece.code.startswith("def latency_test_run_once(")
    assert "Prefill. latency:" in piece.code


def test_show_puts_both_sides_and_callers(capsys):
    code, out, _ = run(capsys, "show", "prepare_for_extend")
    assert code == 0
    assert "sglang/srt/managers/schedule_batch.py" in out and "minisgl/managers/schedule_batch.py" in out
    assert "called by: bench_one_batch.extend" in out


def test_diff_lists_what_sglang_adds(capsys):
    code, out, _ = run(capsys, "diff", "ScheduleBatch.prepare_for_decode")
    assert code == 0
    assert "speculative decoding: self.spec_algorithm" in out
    assert "overlap scheduling: self.enable_overlap" in out
    assert "branch: if self.enable_overlap" in out


def test_scheduler_view_locates_every_step(capsys):
    code, out, _ = run(capsys, "scheduler")
    assert code == 0 and "(missing)" not in out
    for step in ("event_loop_normal", "get_new_batch_prefill", "update_running_batch", "process_batch_result"):
        assert step in out


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["show", "prepare_for_extnd"], "did you mean prepare_for_extend"),
        (["show", "extend"], "'extend' is ambiguous"),
        (["diff", "nothing_like_this"], "no minisgl piece named"),
        (["show", "extend", "--sglang-src", "/nonexistent"], "no sglang package there"),
        (["chain", "warmup"], "unknown chain"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, argv, fragment):
    code, _, err = run(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0]


def test_unparsable_sglang_file_is_reported(tmp_path, capsys, sglang_root):
    fake = tmp_path / "sglang"
    (fake / "srt" / "managers").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "srt" / "managers" / "schedule_batch.py").write_text("def broken(:\n")
    code, _, err = run(capsys, "show", "prepare_for_extend", "--sglang-src", str(tmp_path))
    assert code == 2 and "does not parse" in err


def test_check_reports_a_moved_counterpart(tmp_path, sglang_root):
    """As in 0.5.23, where bench_one_batch.py moved to benchmark/one_batch.py."""
    moved = tmp_path / "src"
    shutil.copytree(sglang_root / "sglang", moved / "sglang", ignore=shutil.ignore_patterns("*.so", "*.json"))
    (moved / "sglang" / "benchmark").mkdir(exist_ok=True)
    (moved / "sglang" / "bench_one_batch.py").rename(moved / "sglang" / "benchmark" / "one_batch.py")
    index, _ = _load(str(PACKAGE_DIR.resolve()))
    problems = check(index, {}, moved)
    assert problems and all("bench_one_batch.py" in p for p in problems)
    assert any("correctness_test" in p and "moved to sglang/benchmark/one_batch.py" in p for p in problems)


def test_check_reports_a_vanished_minisgl_name(monkeypatch, sglang_root):
    monkeypatch.setitem(COUNTERPARTS, "minisgl.gone.Piece", ("Req", "sglang/srt/managers/schedule_batch.py"))
    index, _ = _load(str(PACKAGE_DIR.resolve()))
    assert "mapped minisgl name is gone: minisgl.gone.Piece" in check(index, {}, sglang_root)
