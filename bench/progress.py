"""An unfinished ``bench/perf.py`` run, kept beside its output one finished row at a time.

A whole CPU run takes an hour or more; an engine killed out of memory in its last row, or a Ctrl-C, used to lose
all of it, as the JSON is written only at the end. Now every finished row is saved to ``<output>.partial`` (whole,
by ``write_whole``), and ``--resume`` runs only the rows it lacks. A resumed run must measure the same thing: the
same commit, device, CPU, engines and repetitions, or its rows could not stand in one table. The file goes once
the results are written. SGLang's ``bench_one_batch`` has nothing like it: its runs take seconds on a GPU.
"""

from __future__ import annotations

import json
import os

from minisgl.utils.common import InputError, write_whole

# What a resumed run must share with the unfinished one for their rows to belong to one set of results.
SHARED = ("commit", "device", "cpu", "engines", "reps")


def progress_path(output: str) -> str:
    """Beside the output, named so that no ``*.json`` glob (the results page's) takes it for finished results."""
    return output + ".partial"


def row_key(row: dict) -> tuple:
    return row["model"], row["dtype"], row["batch"], row["input"], row["output"]


def start(output: str, resume: bool, run: dict) -> dict:
    """The run's progress: the unfinished run's under ``--resume``, else a new one with no rows. ``run`` holds the
    ``SHARED`` settings of this run. An unfinished run is never overwritten unasked, nor resumed with other settings."""
    path = progress_path(output)
    if not resume:
        if os.path.exists(path):
            raise InputError(f"{path} holds an unfinished run: add --resume to finish it, or delete it to start over")
        return {**run, "rows": []}
    try:
        with open(path) as f:
            kept = json.load(f)
    except FileNotFoundError:
        raise InputError(f"--resume: no unfinished run at {path}; run without --resume") from None
    except (OSError, ValueError) as e:
        raise InputError(f"--resume: {path} is not an unfinished run of bench/perf.py ({e}); delete it") from None
    if not isinstance(kept, dict) or not isinstance(kept.get("rows"), list):
        raise InputError(f"--resume: {path} is not an unfinished run of bench/perf.py (no rows); delete it")
    for key in SHARED:
        if kept.get(key) != run[key]:
            raise InputError(f"--resume: the unfinished run in {path} has {key} {kept.get(key)}, this one "
                             f"{run[key]}; resume with the same, or delete the file to start over")  # fmt: skip
    return kept


def save(output: str, progress: dict) -> None:
    write_whole(progress_path(output), lambda f: json.dump(progress, f, indent=1))


def finish(output: str) -> None:
    """The results are written: the unfinished run is no more."""
    if os.path.exists(path := progress_path(output)):
        os.remove(path)


def kept_note(output: str) -> str:
    """One sentence on what a stopped run kept, for its last line."""
    try:
        with open(progress_path(output)) as f:
            count = len(json.load(f)["rows"])
    except (OSError, ValueError, KeyError, TypeError):
        count = 0
    if not count:
        return "No row had finished."
    rows = "finished row is" if count == 1 else f"{count} finished rows are"
    return f"The {rows} kept in {progress_path(output)}: the same command with --resume runs the rest."
