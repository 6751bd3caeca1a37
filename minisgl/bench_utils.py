"""The bench's I/O for people: one-line CLI errors, whole-record result appends, rich progress and a
summary table on a terminal (plain lines otherwise). SGLang's bench prints plain lines only; the
SGLang-format lines are printed here unchanged, so its parsing regexes work either way."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse with its usage dump replaced by one line that says what is wrong (still exit code 2)."""

    def error(self, message: str):
        print(f"error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def append_records(path: str, records: Sequence[dict]) -> None:
    """Append JSON lines with one ``write`` on an O_APPEND descriptor: the lines land whole or not at all,
    and what the file already held is never rewritten."""
    if not path or not records:
        return
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


class SweepProgress:
    """A progress bar over the sweep and the decode steps, shown only on an interactive terminal."""

    def __init__(self, num_combinations: int, enabled: bool = True):
        self.enabled = enabled and sys.stdout.isatty()
        self.num_combinations = num_combinations
        self.progress = None
        self.decode_task = None

    def __enter__(self) -> SweepProgress:
        if self.enabled:
            self.progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
            )
            self.progress.start()
            self.sweep_task = self.progress.add_task("sweep", total=self.num_combinations)
        return self

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()

    def start_decode(self, steps: int) -> None:
        if self.progress is not None:
            if self.decode_task is not None:
                self.progress.remove_task(self.decode_task)
            self.decode_task = self.progress.add_task("decode", total=steps)

    def advance_decode(self) -> None:
        if self.progress is not None:
            self.progress.advance(self.decode_task)

    def advance_sweep(self) -> None:
        if self.progress is not None:
            self.progress.advance(self.sweep_task)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)  # no decode step when output_len == 1


def print_summary(results: list[dict]) -> None:
    """One row per measured combination; ASCII borders and no colour when stdout is not a terminal."""
    if not results:
        return
    tty = sys.stdout.isatty()
    table = Table(title="Summary", box=box.SIMPLE if tty else box.ASCII)
    for column in ("run", "batch", "input", "output", "prefill s", "prefill tok/s", "decode s", "decode tok/s",
                   "total s", "total tok/s"):  # fmt: skip
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            r["run_name"], str(r["batch_size"]), str(r["input_len"]), str(r["output_len"]),
            f"{r['prefill_latency']:.5f}", f"{r['prefill_throughput']:.2f}",
            _fmt(r.get("median_decode_latency"), ".5f"), _fmt(r.get("median_decode_throughput"), ".2f"),
            f"{r['total_latency']:.3f}", f"{r['overall_throughput']:.2f}",
        )  # fmt: skip
    Console(force_terminal=tty, width=None if tty else 120).print(table)
