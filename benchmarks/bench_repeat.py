"""Is `inceptionlab bench` repeatable, and does it notice a busy machine? Eager, ONNX Runtime and OpenVINO
fp32 on the demo model (`make demo`: Inception v3 on digits at 80 px), three separate `bench` calls.

    python benchmarks/bench_repeat.py --run RUN_DIR                 # quiet machine: speed-ups within 10%?
    python benchmarks/bench_repeat.py --run RUN_DIR --beside-busy   # and once beside one busy process
    python benchmarks/bench_repeat.py --run RUN_DIR --iters 5 --repeats 2 --no-write   # a smoke run

Each repetition is its own `inceptionlab bench RUN --backend eager,onnxruntime,openvino --precision fp32
--layout nchw --batch 1 --json` process, as a user runs it; the table gives each repetition's speed-ups
(eager fp32 over the row, p50) and how far they differ: the largest speed-up over the smallest, minus 1
(pass: <= 10%). With --beside-busy, one more call runs while a `while True: pass` process keeps one CPU
busy: it must say the machine was not quiet (its warning, and `machine_busy` in its rows), and its
speed-ups are shown beside the quiet ones. Run it on a quiet machine (`uptime`); the file it writes goes
to benchmarks/results/ like the other benchmarks'.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from _results import render_file, write_result  # this folder's sibling module

REPO = Path(__file__).resolve().parents[1]
BACKENDS = "eager,onnxruntime,openvino"
LIMIT = 0.10  # the speed-ups of repetitions on a quiet machine differ by at most this much


def bench_once(run: Path, iters: int, rounds: int) -> tuple[list[dict], str]:
    """One `inceptionlab bench` process: its JSON rows and its stderr (where the busy warning goes)."""
    command = [sys.executable, "-m", "inceptionlab", "bench", str(run), "--backend", BACKENDS, "--precision", "fp32",
               "--layout", "nchw", "--batch", "1", "--iters", str(iters), "--rounds", str(rounds), "--json",
               "--no-plot", "--device", "cpu"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench failed ({done.returncode}):\n{done.stderr}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")], done.stderr


@contextmanager
def busy_process() -> Iterator[None]:
    """A process that keeps one CPU busy until the block ends."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def speedups(rows: list[dict]) -> dict[str, float]:
    return {r["backend"]: r["speedup"] for r in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="The demo's run directory (`make demo`).")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--beside-busy", action="store_true", help="Also one call beside a busy process.")
    parser.add_argument("--no-write", action="store_true", help="Print only; no result file.")
    args = parser.parse_args()

    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    table, runs = [], []
    for number in range(1, args.repeats + 1):
        rows, _ = bench_once(args.run, args.iters, args.rounds)
        runs.append(rows)
        table.append({"call": f"repetition {number}", **speedups(rows),
                      "others_cpus": max(r["others_cpus"] or 0 for r in rows),
                      "busy_said": any(r["machine_busy"] for r in rows)})
        print(table[-1], flush=True)
    spread = {}
    for backend in BACKENDS.split(",")[1:]:
        figures = [row[backend] for row in table if row.get(backend)]
        spread[backend] = max(figures) / min(figures) - 1 if figures else None
    table.append({"call": "largest / smallest - 1", **{b: round(v, 3) for b, v in spread.items() if v is not None}})
    if args.beside_busy:
        with busy_process():
            rows, stderr = bench_once(args.run, args.iters, args.rounds)
        table.append({"call": "beside a busy process", **speedups(rows),
                      "others_cpus": max(r["others_cpus"] or 0 for r in rows),
                      "busy_said": any(r["machine_busy"] for r in rows) and "not quiet" in stderr})
    for row in table[args.repeats:]:
        print(row)
    ok = all(v is not None and v <= LIMIT for v in spread.values())
    print(f"speed-ups of the {args.repeats} repetitions within {LIMIT:.0%}: {'yes' if ok else 'NO'}"
          + ("" if not any(row.get("busy_said") for row in table[:args.repeats]) else
             " (but the machine was not quiet during them: rerun when it is)"))
    if args.beside_busy:
        print(f"the call beside a busy process said so: {'yes' if table[-1]['busy_said'] else 'NO'}")
    if args.no_write:
        return
    columns = [("call", "call"), *((b, f"{b} speed-up", ".2f") for b in BACKENDS.split(",")),
               ("others_cpus", "others' CPUs", ".2f"), ("busy_said", "said busy")]
    path = write_result("bench_repeat", table, title="bench speed-ups over eager fp32, batch 1, three separate calls",
                        columns=columns, settings={k: str(v) for k, v in vars(args).items()},
                        details={"calls": runs})
    print(render_file(path))


if __name__ == "__main__":
    main()
