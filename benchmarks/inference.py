"""Inference latency/throughput of Inception v3 at 299 px: the README's "Fast inference" table.

Measures, in one process and one run, the configurations worth comparing on this machine (eager fp32
NCHW is the reference; every ratio is p50 latency against it at the same batch size), then prints a
Markdown table with p50 latency, the ratio, images/s, achieved GFLOP/s and, for reduced precision,
top-1 agreement with fp32 on held-out real images and whether that makes the model usable.

    python benchmarks/inference.py                       # random weights (latency only), batch 1 and 16
    python benchmarks/inference.py --run RUN_DIR --calib-images DIR --holdout-images DIR
    python benchmarks/inference.py --configs eager:fp32:nchw,onnxruntime:int8 --batch 1 --iters 50

Latency does not depend on the weights' values; agreement does (a random model's logits are near
ties), so agreement is only meaningful with a trained run. Check `uptime` first: other processes on
the same cores distort every row (the load average at measurement is printed with each row).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from _results import render_file, write_result  # this folder's sibling module
from inceptionlab.host import keep_freed_memory
from inceptionlab.fileio import append_jsonl
from inceptionlab.infer.bench import BenchSettings, Config, result_records, run_bench
from inceptionlab.infer.runtimes import RUNTIMES, Target
from inceptionlab.infer.source import load_source
from inceptionlab.runtime import environment

# (backend, precision, layout): the reference, the best of each runtime, and its int8 path.
DEFAULT_CONFIGS = (
    "eager:fp32:nchw,eager:bf16:channels_last,compile:bf16:channels_last,"
    "onnxruntime:fp32,onnxruntime:int8,openvino:fp32,openvino:bf16,openvino:int8"
)


def parse_configs(text: str) -> list[Config]:
    configs = []
    for item in text.split(","):
        backend, precision, *layout = item.strip().split(":")
        native = RUNTIMES[backend].layouts == ("native",)
        configs.append(Config(backend, precision, "native" if native else (layout[0] if layout else "nchw")))
    return configs


COLUMNS = [("backend", "backend"), ("precision", "precision"), ("layout", "layout"), ("batch", "batch"),
           ("p50_ms", "p50 ms", ".1f"), ("latency_vs_eager_fp32", "latency vs eager fp32", ".2f"),
           ("img_per_s", "img/s", ".1f"), ("gflops", "GFLOP/s", ".0f"), ("first_ms", "first call ms", ".0f"),
           ("agreement_text", "top-1 agreement with fp32"), ("usable", "usable")]


def table_rows(rows: list[dict]) -> list[dict]:
    """Rows by batch, fastest first, with p50 latency over eager fp32 NCHW's at the same batch."""
    ordered = []
    for batch in sorted({r["batch"] for r in rows}):
        base = next((r for r in rows if r["batch"] == batch and (r["backend"], r["precision"], r["layout"]) ==
                     ("eager", "fp32", "nchw")), None)
        for r in sorted((r for r in rows if r["batch"] == batch), key=lambda r: r["p50_ms"]):
            agree = None if r.get("agreement") is None else f"{r['agreement']:.1%} (n={r['agreement_images']})"
            ordered.append({**r, "latency_vs_eager_fp32": r["p50_ms"] / base["p50_ms"] if base else None,
                            "agreement_text": agree})
    return ordered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="A trained run directory (default: --model with random weights).")
    parser.add_argument("--model", default="inception_v3")
    parser.add_argument("--weights", default="random")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="Comma list of backend:precision[:layout].")
    parser.add_argument("--batch", default="1,16")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--calib-images", type=Path, action="append", default=[])
    parser.add_argument("--holdout-images", type=Path, action="append", default=[])
    parser.add_argument("--out", type=Path, default=Path("runs/exports"))
    parser.add_argument("--json", action="store_true", help="Also print every row as JSON.")
    args = parser.parse_args()
    keep_freed_memory()  # the heap `inceptionlab bench` runs on

    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    source = load_source(args.run, None if args.run else args.model, None if args.run else args.weights, args.out)
    settings = BenchSettings([int(b) for b in args.batch.split(",")], args.iters, args.warmup, Target("cpu"),
                             args.calib_images, args.holdout_images)
    report = run_bench(source, parse_configs(args.configs), settings, log=lambda m: print(m, flush=True))
    env = environment("cpu")
    append_jsonl(source.bench_results,
                 list(result_records(report, source, settings, "python benchmarks/inference.py", env)))
    print(f"\n{source.spec.arch} at {source.spec.crop_size} px, {report.rows[0]['gflop_per_image']} GFLOP/image; "
          f"{env['cpu']}, {env['torch_threads']} torch threads; torch {env['versions'].get('torch')}, "
          f"onnxruntime {env['versions'].get('onnxruntime')}, openvino {env['versions'].get('openvino')}; "
          f"iters {args.iters}, warm-up {args.warmup}; load average after: {os.getloadavg()[0]:.2f}\n")
    rows = table_rows(report.rows)
    path = write_result("inference", rows, env=env, settings={k: str(v) for k, v in vars(args).items()},
                        columns=COLUMNS, title=f"{source.spec.arch} inference at {source.spec.crop_size} px, "
                                               f"{report.rows[0]['gflop_per_image']} GFLOP per image")
    print(render_file(path))
    for skipped in report.skipped:
        print(f"skipped {skipped.config.label}: {skipped.reason}")
    if args.json:
        for row in report.rows:
            print(json.dumps(row))


if __name__ == "__main__":
    main()
