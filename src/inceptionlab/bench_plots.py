"""Latency and throughput bars from bench/results.jsonl (the file only; never the runtimes).

plots/bench_latency.png     p50 latency per configuration and batch size (whiskers: p90)
plots/bench_throughput.png  images/s per configuration and batch size

Only the latest `inceptionlab bench` call's rows are drawn: rows of one call were measured together,
rows of different calls may not be comparable (load, versions).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from inceptionlab.plots import new_figure, save_figure


def read_rows(results: Path) -> list[dict[str, Any]]:
    rows = []
    for line in Path(results).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash
    return rows


def latest_run(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not rows:
        return []
    last = rows[-1].get("run_id")
    return [r for r in rows if r.get("run_id") == last]


def _label(row: dict[str, Any]) -> str:
    layout = "" if row.get("layout") in ("native", "nchw", None) else f"\n{row['layout']}"
    tta = "" if row.get("tta", "none") == "none" else f"\ntta {row['tta']}"
    return f"{row['backend']}\n{row['precision']}{layout}{tta}"


def _bars(rows: list[dict[str, Any]], value: str, whisker: str | None, ylabel: str, title: str, path: Path) -> Path:
    labels = list(dict.fromkeys(_label(r) for r in rows))
    batches = sorted({r["batch"] for r in rows})
    width = 0.8 / len(batches)
    fig, ax = new_figure((max(6.4, 1.1 * len(labels) + 2), 4.2))
    x = np.arange(len(labels))
    for i, batch in enumerate(batches):
        by_label = {_label(r): r for r in rows if r["batch"] == batch}
        heights = [by_label[name][value] if name in by_label else np.nan for name in labels]
        errors = None
        if whisker:
            errors = [[0] * len(labels),
                      [by_label[n][whisker] - by_label[n][value] if n in by_label else 0 for n in labels]]
        ax.bar(x + (i - (len(batches) - 1) / 2) * width, heights, width, yerr=errors, capsize=2,
               label=f"batch {batch}")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_bench(results: Path, out_dir: Path) -> list[Path]:
    """Draw the latest bench call's latency and throughput bars into out_dir; [] without results."""
    rows = latest_run(read_rows(results)) if Path(results).is_file() else []
    if not rows:
        return []
    first = rows[0]
    size = first.get("input_shape", [""])[-1]
    where = f"{first.get('model', '')} {size} px on {first.get('env', {}).get('device_name', '')}"
    return [
        _bars(rows, "p50_ms", "p90_ms", "latency per batch, ms (p50; whisker p90)", f"latency: {where}",
              Path(out_dir) / "bench_latency.png"),
        _bars(rows, "img_per_s", None, "images/s", f"throughput: {where}", Path(out_dir) / "bench_throughput.png"),
    ]


def plot_bench_run(home: Path) -> list[Path]:
    """plots/bench_*.png of a run directory (or an export folder) from its bench/results.jsonl."""
    return plot_bench(Path(home) / "bench" / "results.jsonl", Path(home) / "plots")
