"""minisgl pieces and their SGLang counterparts: lookup by short name, the scheduler view, and ``check``.

A piece is a class, function or method of minisgl, named by its qualified name. Its counterpart comes
from ``counterparts.py``; a key of ``NO_COUNTERPART`` that names a module or class covers what is inside.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from reader.counterparts import COUNTERPARTS, NO_COUNTERPART
from reader.index import Index
from reader.sglang_source import ReaderError, find_piece


@dataclass(frozen=True)
class Counterpart:
    qualname: str | None
    path: str | None
    reason: str | None  # why there is none, when qualname is None


def counterpart_of(qname: str) -> Counterpart | None:
    """The mapping of ``qname``, or None when neither table speaks of it."""
    if qname in COUNTERPARTS:
        return Counterpart(*COUNTERPARTS[qname], None)
    parts = qname.split(".")
    for i in range(len(parts), 1, -1):
        prefix = ".".join(parts[:i])
        if prefix in NO_COUNTERPART:
            return Counterpart(None, None, NO_COUNTERPART[prefix])
    return None


def piece_names(index: Index) -> list[str]:
    return sorted([*index.classes, *index.functions])


def resolve_name(index: Index, name: str) -> str:
    """A qualified name from a short form (``prepare_for_extend``, ``ScheduleBatch.prepare_for_extend``)."""
    names = piece_names(index)
    if name in names:
        return name
    matches = [q for q in names if q.endswith("." + name)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ReaderError(f"{name!r} is ambiguous: {', '.join(m.removeprefix('minisgl.') for m in matches)}")
    short = {q.removeprefix("minisgl."): q for q in names} | {q.rsplit(".", 1)[-1]: q for q in names}
    close = difflib.get_close_matches(name, list(short), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ReaderError(f"no minisgl piece named {name!r}{hint}")


# SGLang's scheduler loop, step by step, beside the bench step that stands for it.
SCHEDULER_STEPS = [
    ("Scheduler.event_loop_normal", "sglang/srt/managers/scheduler.py", "minisgl.bench_one_batch.latency_test",
     "the loop itself: the bench runs one static batch once instead of looping forever"),
    ("SchedulerRequestReceiver.recv_requests", "sglang/srt/managers/scheduler_components/request_receiver.py",
     "minisgl.bench_one_batch.prepare_synthetic_inputs_for_latency_test",
     "requests arrive over ZMQ from the tokenizer manager; the bench builds Reqs from prompts or random ids"),
    ("Scheduler.process_input_requests", "sglang/srt/managers/scheduler.py", "minisgl.bench_one_batch._make_req",
     "dispatch by request type (generate, embed, abort, flush, weights, profile...), then the waiting queue"),
    ("Scheduler.get_next_batch_to_run", "sglang/srt/managers/scheduler.py", None,
     "chooses prefill or decode each iteration and merges finished prefills into the running batch"),
    ("Scheduler.get_new_batch_prefill", "sglang/srt/managers/scheduler.py", "minisgl.bench_one_batch.extend",
     "prefix matching in the radix cache, admission by the schedule policy, chunked prefill, then "
     "ScheduleBatch.init_new + prepare_for_extend: the bench keeps only the last two"),
    ("Scheduler.update_running_batch", "sglang/srt/managers/scheduler.py", "minisgl.bench_one_batch.decode",
     "filters finished requests, retracts when memory runs short, then prepare_for_decode"),
    ("Scheduler.run_batch", "sglang/srt/managers/scheduler.py", "minisgl.model_executor.model_runner.ModelRunner.forward",
     "through the TP worker (and overlap thread) to ModelRunner.forward and sample"),
    ("Scheduler.process_batch_result", "sglang/srt/managers/scheduler.py", None,
     "appends tokens, checks finish conditions, frees KV into the tree cache, streams out; the bench only "
     "collects next_token_ids"),
]  # fmt: skip


@lru_cache(maxsize=4)
def _definitions(sglang_root: Path) -> dict[str, list[str]]:
    """Top-level class/function name -> files that define it, over the whole SGLang tree (one regex pass)."""
    pattern = re.compile(r"^(?:class|def|async def) (\w+)", re.MULTILINE)
    names: dict[str, list[str]] = {}
    for file in sorted((sglang_root / "sglang").rglob("*.py")):
        for name in set(pattern.findall(file.read_text(errors="replace"))):
            names.setdefault(name, []).append(str(file.relative_to(sglang_root)))
    return names


def locate(sglang_root: Path, qualname: str, old_path: str) -> list[str]:
    """Where a counterpart went in another release: the files most like its old path that define it."""
    candidates = _definitions(sglang_root).get(qualname.split(".")[0], [])
    likely = sorted(candidates, key=lambda f: -difflib.SequenceMatcher(None, f, old_path).ratio())[:3]
    return [f for f in likely if find_piece(sglang_root, f, qualname)][:1]


def check(index: Index, chain_names: dict[str, set[str]], sglang_root: Path) -> list[str]:
    """Problems that make ``reader check`` fail: stale keys, missing counterparts, unmapped chain pieces."""
    problems = []
    known = set(piece_names(index)) | set(index.modules)
    for key in [*COUNTERPARTS, *NO_COUNTERPART]:
        if key not in known:
            problems.append(f"mapped minisgl name is gone: {key}")
    for key, (qualname, path) in sorted(COUNTERPARTS.items()):
        if find_piece(sglang_root, path, qualname) is None:
            moved = locate(sglang_root, qualname, path)
            where = f"moved to {', '.join(moved)}" if moved else "vanished"
            problems.append(f"counterpart missing from SGLang source: {key} -> {path}::{qualname} ({where})")
    for qualname, path, _, _ in SCHEDULER_STEPS:
        if find_piece(sglang_root, path, qualname) is None:
            problems.append(f"scheduler step missing from SGLang source: {path}::{qualname}")
    for chain, names in sorted(chain_names.items()):
        for name in sorted(names):
            if counterpart_of(name) is None:
                problems.append(f"{chain} chain piece has no mapping: {name}")
    return problems
