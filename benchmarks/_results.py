"""Benchmark results as data: one JSON file per benchmark run, and the Markdown tables drawn from them.

Every script in benchmarks/ ends with `write_result(...)`, which writes

    benchmarks/results/<benchmark>--<machine>--<YYYYmmdd-HHMMSS>.json

holding the rows it measured, the columns a table shows, the settings and command that rerun it, and
the environment record of `inceptionlab.runtime.environment` (CPU or GPU name, CPU capability,
cores, threads, versions): a figure always carries the machine it was measured on. The docs'
performance page is rendered from these files (`render_benchmark`, called by the MkDocs hook in
docs/hooks/ and by `python benchmarks/render_results.py`), the newest file per benchmark and
machine; nothing in the docs is copied by hand.

`INCEPTIONLAB_BENCHMARK_RESULTS=DIR` sends results elsewhere (a trial run that should not land in
the docs).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

SCHEMA = 1
RESULTS = Path(__file__).resolve().parent / "results"
RESULTS_ENV = "INCEPTIONLAB_BENCHMARK_RESULTS"

RECORD_FIELDS = frozenset({"schema", "benchmark", "title", "command", "settings", "columns", "rows", "env"})

# (row key, column header) or (row key, column header, format spec); missing values print as "-".
Column = Sequence[str]


def results_folder() -> Path:
    return Path(os.environ.get(RESULTS_ENV) or RESULTS)


def machine_slug(env: dict[str, Any]) -> str:
    """The measuring device as a file-name part: 'amd-epyc-7763-64-core-processor-avx512-bf16'.

    A CPU's name alone does not tell machines apart (cloud VMs say just "AMD EPYC" on Zen 3 and Zen 4),
    so CPUs add the capability torch dispatches to and whether they have bf16 units.
    """
    name = re.sub(r"\((r|tm)\)", "", str(env.get("device_name") or env.get("cpu") or "unknown"), flags=re.I)
    if str(env.get("device", "cpu")).startswith("cpu"):
        name += f" {env.get('cpu_capability') or ''}" + (" bf16" if env.get("cpu_bf16") else "")
        name += " isa-capped" if env.get("speed_env", {}).get("ONEDNN_MAX_CPU_ISA") else ""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:80] or "unknown"


def write_result(benchmark: str, rows: list[dict[str, Any]], *, title: str, columns: Iterable[Column],
                 settings: dict[str, Any], device: str = "cpu", details: dict[str, Any] | None = None,
                 folder: Path | None = None, env: dict[str, Any] | None = None, stamp: str | None = None,
                 quiet: bool = False) -> Path:
    """Write one result file atomically and return its path; `details` holds what no table shows.
    `stamp`: the file's time (default now); a report rewritten as it goes passes the same one each time."""
    from inceptionlab.fileio import atomic_write_json  # here: the renderer needs neither torch nor the package

    clashing = sorted(set(details or {}) & RECORD_FIELDS)
    if clashing:  # a detail named like a field would replace it (bench_repeat's "rows" once did: unrenderable)
        raise ValueError(f"details may not use the record's own field names: {', '.join(clashing)}")
    if env is None:
        from inceptionlab.runtime import environment

        env = environment(device)
    record = {"schema": SCHEMA, "benchmark": benchmark, "title": title,
              "command": shlex.join(["python", *sys.argv]), "settings": settings,
              "columns": [list(column) for column in columns], "rows": rows, "env": env, **(details or {})}
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    path = (folder or results_folder()) / f"{benchmark}--{machine_slug(env)}--{stamp}.json"
    atomic_write_json(path, record)
    if not quiet:
        print(f"result: {path}", flush=True)
    return path


def read_results(folder: Path) -> list[dict[str, Any]]:
    """The newest result per (benchmark, machine) in `folder`, by benchmark and machine; other files are ignored."""
    newest: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
    for path in sorted(Path(folder).glob("*--*--*.json")):
        record = json.loads(path.read_text())
        if record.get("schema") != SCHEMA:
            raise ValueError(f"{path}: result schema {record.get('schema')!r}, this renderer reads {SCHEMA}")
        benchmark, slug, stamp = path.stem.rsplit("--", 2)
        if (benchmark, slug) not in newest or stamp > newest[(benchmark, slug)][0]:
            newest[(benchmark, slug)] = (stamp, record)
    return [newest[key][1] for key in sorted(newest)]


def render_benchmark(benchmark: str, folder: Path | None = None) -> str:
    """Markdown for one benchmark: a table per machine, each headed by that machine, or a plain 'none yet'."""
    records = [r for r in read_results(folder or results_folder()) if r["benchmark"] == benchmark]
    if not records:
        return (f"*No results yet.* Run `python benchmarks/{benchmark}.py` on a quiet machine: it writes "
                f"`benchmarks/results/{benchmark}--<machine>--<time>.json`, and this table is drawn from it.")
    return "\n\n".join(render_record(record) for record in records)


def render_file(path: Path) -> str:
    return render_record(json.loads(Path(path).read_text()))


def render_record(record: dict[str, Any]) -> str:
    lines = [f"**{machine_line(record['env'])}**: {record['title']}", "",
             f"{software_line(record['env'])}; `{record['command']}`", "", *table(record["columns"], record["rows"])]
    return "\n".join(lines)


def machine_line(env: dict[str, Any]) -> str:
    cpu = env.get("cpu", "unknown CPU")
    bf16 = "bf16 units" if env.get("cpu_bf16") else "no bf16 units"
    capped = env.get("speed_env", {}).get("ONEDNN_MAX_CPU_ISA")
    isa = f", ISA capped to {capped} by ONEDNN_MAX_CPU_ISA" if capped else ""
    parts = [f"{cpu} ({env.get('cpu_capability', 'capability unknown')}, {bf16}{isa}, {env.get('cpu_count', '?')} "
             f"cores, {env.get('torch_threads', '?')} torch threads)"]
    if str(env.get("device", "cpu")).startswith("cuda"):
        parts.insert(0, f"{env.get('device_name')} ({env.get('build', 'GPU')})")
    return " on ".join(parts)


def software_line(env: dict[str, Any]) -> str:
    versions = env.get("versions", {})
    shown = ", ".join(f"{name} {versions[name]}" for name in ("torch", "onnxruntime", "openvino") if name in versions)
    load = env.get("load_average")
    # The record is taken as the result is written: its time and load are those at the run's end.
    return f"{shown}; {env.get('time', '')}" + ("" if load is None else f", 1-minute load average {load} at the end")


def table(columns: list[list[str]], rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| " + " | ".join(column[1] for column in columns) + " |",
             "|" + "|".join("---:" if column[2:] else "---" for column in columns) + "|"]  # figures right-aligned
    for row in rows:
        lines.append("| " + " | ".join(cell(row.get(column[0]), *column[2:]) for column in columns) + " |")
    return lines


def cell(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return format(value, spec or ".4g")
    if isinstance(value, list):
        return ", ".join(cell(item, spec) for item in value)
    if isinstance(value, str):  # a bound such as "<26.5" among figures
        return value.replace("|", "\\|")
    return format(value, spec) if spec else str(value).replace("|", "\\|")
