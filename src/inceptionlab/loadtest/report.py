"""Load-test results: JSON lines, a table and the latency-vs-rate plot (from rows only).

results.jsonl          one row per measurement, with the command, settings and environment
plots/loadtest.png     p50/p99/p99.9 latency and achieved rate against offered rate, SLO line
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from inceptionlab import host
from inceptionlab.plots import new_figure, save_figure


def client_environment() -> dict[str, Any]:
    """The client machine (the server's may differ): the torch-free base of the one environment record
    (host.environment), with the command line's --api-key value hidden."""
    return {**host.environment(), "argv": redacted(sys.argv)}


def redacted(argv: list[str]) -> list[str]:
    """The command line with the value of --api-key replaced: keys never reach results files."""
    out, hide = [], False
    for arg in argv:
        out.append("***" if hide else ("--api-key=***" if arg.startswith("--api-key=") else arg))
        hide = arg == "--api-key"
    return out


def records(rows: list[dict[str, Any]], url: str, command: str, settings: dict[str, Any],
            env: dict[str, Any]) -> list[dict[str, Any]]:
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    return [{**row, "run_id": run_id, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "url": url, "command": command,
             "argv": redacted(sys.argv), "settings": settings, "env": env} for row in rows]


def _cell(value: Any, width: int, spec: str) -> str:
    return f"{'-' if value is None else format(value, spec):>{width}}"


def format_table(rows: list[dict[str, Any]]) -> str:
    """One line per measurement; `client CPU` is the generator's own (cores, `!` when it may have been
    the bottleneck: client_warning_lines says why)."""
    header = (f"{'load':>10} {'offered/s':>9} {'achieved/s':>10} {'ok':>6} {'rej.':>5} {'errors':>6} "
              f"{'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'p99.9 ms':>8} {'batch':>6} {'queue ms':>8} "
              f"{'compute ms':>10} {'client CPU':>10}  SLO")
    lines = [header, "-" * len(header)]
    for r in rows:
        load = f"{r['rate']:.3g}/s" if r["mode"] == "open" else f"C={r['concurrency']}"
        server = r.get("server") or {}
        errors = r["error"] + r["timeout"] + r.get("not_sent", 0)
        cpu = "-" if r.get("client_cpu") is None else f"{r['client_cpu']:.0%}{'!' if r.get('client_warnings') else ''}"
        lines.append(
            f"{load:>10} {r['offered_rate']:>9.2f} {r['achieved_rate']:>10.2f} {r['ok']:>6} {r['rejected']:>5} "
            f"{errors:>6} {_cell(r['p50_ms'], 8, '.1f')} {_cell(r['p90_ms'], 8, '.1f')} "
            f"{_cell(r['p99_ms'], 8, '.1f')} {_cell(r['p999_ms'], 8, '.1f')} "
            f"{_cell(server.get('avg_batch'), 6, '.2f')} "
            f"{_cell(server.get('queue_ms'), 8, '.1f')} {_cell(server.get('compute_ms'), 10, '.1f')} {cpu:>10}  "
            f"{'held' if r['slo_met'] else 'MISSED'}")
    return "\n".join(lines)


def client_warning_lines(rows: list[dict[str, Any]]) -> list[str]:
    """`warning: ...` for each measurement the generator itself may have limited."""
    lines = []
    for r in rows:
        load = f"rate {r['rate']:.3g}/s" if r["mode"] == "open" else f"concurrency {r['concurrency']}"
        lines += [f"warning ({load}): {message}" for message in r.get("client_warnings", [])]
    return lines


def plot_latency_vs_rate(rows: list[dict[str, Any]], path: Path, title: str = "") -> Path | None:
    """Latency percentiles (log scale) and achieved rate against the offered rate; None when no
    open-loop rows."""
    points = sorted((r for r in rows if r["mode"] == "open"), key=lambda r: r["offered_rate"])
    if not points:
        return None
    offered = [r["offered_rate"] for r in points]
    fig, (lat, thr) = new_figure((10, 4), 1, 2)
    for key, label in (("p50_ms", "p50"), ("p99_ms", "p99"), ("p999_ms", "p99.9")):
        lat.plot(offered, [r[key] if r[key] is not None else float("nan") for r in points], marker="o",
                 markersize=3, label=label)
    lat.axhline(points[0]["slo_ms"], color="red", linestyle="--", linewidth=1, label=f"SLO {points[0]['slo_ms']:g} ms")
    lat.set_yscale("log")
    lat.set_xlabel("offered rate, requests/s (Poisson)")
    lat.set_ylabel("latency from scheduled send, ms")
    lat.grid(alpha=0.3, which="both")
    lat.legend(fontsize=8)
    thr.plot(offered, [r["achieved_rate"] for r in points], marker="o", markersize=3, label="achieved (ok)")
    thr.plot(offered, offered, color="grey", linestyle=":", label="offered")
    thr.set_xlabel("offered rate, requests/s")
    thr.set_ylabel("requests/s")
    thr.grid(alpha=0.3)
    thr.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    return save_figure(fig, Path(path))
