"""The demo's training speed on a quiet machine and beside one busy process, per CPU thread policy.

OpenMP splits every operator over torch's threads and waits for the slowest, so a thread that shares
its core with another busy process makes every operator wait for that process's time slice. This
measures what that costs and what each policy recovers: for each row, `inceptionlab demo` with
`train.epochs=2` in a fresh process (the speed cache filled by a first, untimed run), with or without
one busy process beside it (a pure-Python loop: one CPU's worth of load), and reports each epoch's
img/s from the run's metrics and the whole command's wall time.

Policies: `governed` (the default: threads follow the CPUs other processes leave free, checked
before each step at most every 2 s), `OMP_NUM_THREADS=N` (fixed), and `OMP_WAIT_POLICY=PASSIVE`
(OpenMP threads sleep instead of spinning while they wait).

    python benchmarks/threads.py                 # ~8 minutes on 2 cores
    python benchmarks/threads.py --rows quiet_governed,busy_governed
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import write_result  # this folder's sibling module

# name -> (a busy process beside it, environment)
ROWS = {
    "quiet_governed": (False, {}),
    "quiet_1_thread": (False, {"OMP_NUM_THREADS": "1"}),
    "busy_governed": (True, {}),
    "busy_2_threads": (True, {"OMP_NUM_THREADS": "2"}),
    "busy_2_threads_passive": (True, {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"}),
    "busy_1_thread": (True, {"OMP_NUM_THREADS": "1"}),
}


def run_demo(work: Path, env: dict[str, str], busy: bool) -> dict:
    """One 2-epoch demo in a fresh process; with `busy`, a CPU-bound process runs beside it throughout."""
    out = Path(tempfile.mkdtemp(dir=work))
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    started = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "inceptionlab", "demo", "--no-progress", "--out", str(out),
                               "--data", str(work / "digits"), "--set", "train.epochs=2"],
                              capture_output=True, text=True, env={**os.environ, **env})
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"demo failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    metrics = next(out.glob("demo/digits/*/metrics.jsonl")).read_text().splitlines()
    epochs = [row["images_per_s"] for row in map(json.loads, metrics) if row["epoch"] > 0]  # 0: the start's validation
    changes = [line for line in proc.stdout.splitlines() if line.startswith("threads: ") and "->" in line]
    return {"epoch1_img_per_s": round(epochs[0], 1), "epoch2_img_per_s": round(epochs[-1], 1),
            "wall_s": round(wall, 1), "thread_changes": changes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma list of {', '.join(ROWS)}")
    args = parser.parse_args()
    names = [n.strip() for n in args.rows.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        parser.error(f"--rows {','.join(unknown)}: use {', '.join(ROWS)}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run_demo(work, {}, busy=False)  # untimed: makes the data, fills the speed cache and the page cache
        for name in names:
            busy, env = ROWS[name]
            row = {"row": name, "busy_process": busy, "env": " ".join(f"{k}={v}" for k, v in env.items()) or "-",
                   **run_demo(work, env, busy)}
            rows.append(row)
            print(f"{name:<24} epoch 1 {row['epoch1_img_per_s']:6.1f} img/s  epoch 2 {row['epoch2_img_per_s']:6.1f} "
                  f"img/s  wall {row['wall_s']:5.1f} s  {'; '.join(row['thread_changes'])}", flush=True)
    quiet = next((r["epoch2_img_per_s"] for r in rows if r["row"] == "quiet_governed"), None)
    for row in rows:
        row["quiet_over_this"] = round(quiet / row["epoch2_img_per_s"], 2) if quiet else None
    write_result("threads", rows, settings={k: str(v) for k, v in vars(args).items()},
                 title="The demo (2 epochs) quiet and beside one busy process, per thread policy",
                 columns=[("row", "row"), ("busy_process", "busy process beside it"), ("env", "environment"),
                          ("epoch1_img_per_s", "epoch 1 img/s", ".1f"), ("epoch2_img_per_s", "epoch 2 img/s", ".1f"),
                          ("quiet_over_this", "quiet / this, epoch 2", ".2f"), ("wall_s", "whole command s", ".1f")])


if __name__ == "__main__":
    main()
