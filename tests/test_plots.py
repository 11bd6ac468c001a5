"""Plots are files drawn with matplotlib's object API: nothing of the process changes."""

from __future__ import annotations

import json
import subprocess
import sys

DRAW_IN_AN_APPLICATION = """
import json, sys
from pathlib import Path

import matplotlib

matplotlib.use("svg")  # the backend an application (a notebook, a GUI, a web app) chose
from inceptionlab.bench_plots import plot_bench
from inceptionlab.plots import plot_confusion

out = Path(sys.argv[1])
(out / "confusion.csv").write_text("true,a,b\\na,3,1\\nb,0,4\\n")
row = {"backend": "eager", "precision": "fp32", "layout": "nchw", "batch": 1, "p50_ms": 1.0, "p90_ms": 2.0,
       "img_per_s": 9.0, "run_id": "r"}
(out / "results.jsonl").write_text(json.dumps(row) + "\\n")
drawn = [plot_confusion(out / "confusion.csv", out / "confusion.png"), *plot_bench(out / "results.jsonl", out)]
print(json.dumps({"backend": matplotlib.get_backend(), "pyplot": "matplotlib.pyplot" in sys.modules,
                  "drawn": [p.name for p in drawn if p.stat().st_size > 1000]}))
"""


def test_drawing_changes_no_process_wide_matplotlib_state(tmp_path):
    proc = subprocess.run([sys.executable, "-c", DRAW_IN_AN_APPLICATION, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"backend": "svg", "pyplot": False,
                                       "drawn": ["confusion.png", "bench_latency.png", "bench_throughput.png"]}
