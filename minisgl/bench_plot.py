"""Chart the latency records of ``bench_one_batch`` result files, so runs compare on one image.

    python -m minisgl.bench_plot result.jsonl -o chart.png
    python -m minisgl.bench_plot a.jsonl b.jsonl -o chart.png --run-name fp32 bf16

Panels: prefill and decode latency and throughput against batch size (left) and input length (right).
Colour = run name; each value of the other length gets a line style ("fp32, input 128"). Repeats of a
point (output lengths, appended runs) are averaged; correctness records are skipped, and records with
output_len 1 in decode panels. Bad input: one ``error:`` line, exit code 2, no file written.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict

from minisgl.bench_utils import OneLineErrorParser
from minisgl.utils.common import write_whole

LATENCY_KEYS = ("run_name", "batch_size", "input_len", "output_len", "prefill_latency", "total_latency")
METRICS = (
    ("prefill_latency", "prefill latency (s)"),
    ("median_decode_latency", "decode latency per step (s)"),
    ("prefill_throughput", "prefill throughput (token/s)"),
    ("median_decode_throughput", "decode throughput (token/s)"),
)
AXES = (("batch_size", "batch size", "input_len", "input"), ("input_len", "input length", "batch_size", "batch"))
LINE_STYLES = ("-", "--", ":", "-.")


class PlotError(Exception):
    """Bad input, printed as one ``error:`` line."""


def load_records(paths: list[str], run_names: list[str] | None) -> list[dict]:
    records = []
    for path in paths:
        try:
            with open(path, errors="replace") as f:
                lines = f.readlines()
        except OSError as e:
            raise PlotError(f"cannot read {path}: {e.strerror}") from None
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise PlotError(f"{path} line {lineno} is not JSON; pass a bench_one_batch result file") from None
            if isinstance(record, dict) and all(k in record for k in LATENCY_KEYS):
                numbers = [record[k] for k in LATENCY_KEYS[1:]] + [v for m, _ in METRICS if (v := record.get(m))]
                if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers):
                    raise PlotError(f"{path} line {lineno} has a non-numeric length or latency")
                records.append(record)
    if not records:
        raise PlotError(f"no latency records in {', '.join(paths)}; run bench_one_batch without --correctness-test")
    found = sorted({str(r["run_name"]) for r in records})
    if run_names:
        unknown = [n for n in run_names if n not in found]
        if unknown:
            raise PlotError(f"run name {unknown[0]!r} not in the results; found: {', '.join(found)}")
        records = [r for r in records if str(r["run_name"]) in run_names]
    return records


def series(records: list[dict], metric: str, x_key: str, group_key: str) -> dict:
    """{(run name, group value): sorted [(x, mean metric)]} over the records that have the metric."""
    points = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.get(metric) is not None:
            points[(str(r["run_name"]), r[group_key])][r[x_key]].append(float(r[metric]))
    return {k: sorted((x, sum(v) / len(v)) for x, v in xs.items()) for k, xs in sorted(points.items())}


def draw(records: list[dict], title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = list(dict.fromkeys(str(r["run_name"]) for r in records))
    colours = {name: f"C{i % 10}" for i, name in enumerate(runs)}
    fig, axes = plt.subplots(len(METRICS), len(AXES), figsize=(12, 3.2 * len(METRICS)), squeeze=False)
    for col, (x_key, x_label, group_key, group_label) in enumerate(AXES):
        groups = sorted({r[group_key] for r in records})
        styles = {g: LINE_STYLES[i % len(LINE_STYLES)] for i, g in enumerate(groups)}
        xs = sorted({r[x_key] for r in records})
        for row, (metric, y_label) in enumerate(METRICS):
            ax = axes[row][col]
            for (run, group), pts in series(records, metric, x_key, group_key).items():
                label = run if len(groups) == 1 else f"{run}, {group_label} {group}"
                ax.plot(*zip(*pts), marker="o", color=colours[run], linestyle=styles[group], label=label)
            if len(xs) > 1 and xs[-1] >= 4 * xs[0]:
                ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.set(xlabel=x_label, ylabel=y_label)
            ax.grid(True, alpha=0.3)
            if ax.lines:
                ax.legend(fontsize="small")
            else:
                ax.text(0.5, 0.5, "no data (output_len 1)", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def save_atomic(fig, output: str) -> None:
    fmt = os.path.splitext(output)[1].lstrip(".").lower() or "png"
    if fmt not in fig.canvas.get_supported_filetypes():
        raise PlotError(f"-o {output}: unknown image format {fmt!r}; use .png, .svg or .pdf")
    try:
        write_whole(output, lambda f: fig.savefig(f, format=fmt, dpi=100), binary=True)
    except OSError as e:
        raise PlotError(f"-o {output} cannot be written: {e.strerror}") from None


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python -m minisgl.bench_plot", description=__doc__.split("\n")[0])
    parser.add_argument("result_files", nargs="+", metavar="RESULT_JSONL", help="bench_one_batch result files")
    parser.add_argument("-o", "--output", required=True, help="image to write (.png, .svg or .pdf)")
    parser.add_argument("--run-name", nargs="+", default=None, help="plot only these run names")
    parser.add_argument("--title", default="bench_one_batch", help="chart title")
    args = parser.parse_args(argv)
    try:
        records = load_records(args.result_files, args.run_name)
        save_atomic(draw(records, args.title), args.output)
    except PlotError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"chart of {len(records)} records saved to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
