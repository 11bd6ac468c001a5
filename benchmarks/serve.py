"""Serving benchmark: server overhead and dynamic batching of `inceptionlab serve`, measured in one run.

For each server configuration (batching off, batching on with 0 and 2 ms delay, two instances), this
starts `inceptionlab serve` as a subprocess on 127.0.0.1 (a free port), waits for it to be ready, and
with the loadtest library:

1. saturation: closed loop (2 x max batch x instances clients) with preprocessed UINT8 tensors, then
   with JPEG files: the server's throughput, and the share of it that decoding costs;
2. low load: an open-loop Poisson run at --low-rate (p50/p99 when batches rarely form);
3. sweep: the highest Poisson rate whose p99 stays <= --slo-ms (rate x1.5 until it fails, then bisect);

then stops the server (SIGTERM). Last, `bench` times the same runtime and precision at batch 1 and at
the max batch in this process (no server running), so "server overhead" = server saturation
throughput with tensors / bench images/s at the same batch size.

    python benchmarks/serve.py                                   # ~10 minutes on 2 cores
    python benchmarks/serve.py --duration 10 --configs unbatched,batch8_delay2

Latency does not depend on the weights' values: random weights (seed 0) are used. The machine's load
average is recorded before and after each configuration: other processes on the same cores distort
every figure, and the table says so.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from _results import render_file, write_result  # this folder's sibling module
from inceptionlab.loadtest.generator import LoadSettings, run_load, run_sweep

# name -> `inceptionlab serve` options. "instances": two sessions, each with its own worker thread
# (OpenVINO's CPU "streams" idea: two batches in flight on the cores instead of one).
CONFIGS = {
    "unbatched": ["--max-batch", "1", "--max-delay-ms", "0"],
    "batch8_delay0": ["--max-batch", "8", "--max-delay-ms", "0"],
    "batch8_delay2": ["--max-batch", "8", "--max-delay-ms", "2"],
    "batch8_delay2_x2": ["--max-batch", "8", "--max-delay-ms", "2", "--instances", "2"],
}
READY_TIMEOUT_S = 600  # first start exports Inception v3 and compiles one OpenVINO model per batch size


def option(args: list[str], name: str, default: str) -> str:
    return args[args.index(name) + 1] if name in args else default


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def load_average() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


class Server:
    """`inceptionlab serve` in a subprocess; a context manager that always stops it."""

    def __init__(self, model: str, backend: str, precision: str, extra: list[str], log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "inceptionlab", "serve", "--model", model, "--weights", "random",
                        "--backend", backend, "--precision", precision, "--port", str(self.port), *extra]
        self.log = log

    def __enter__(self) -> "Server":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(self.log, "w")
        self.process = subprocess.Popen(self.command, stdout=self.handle, stderr=subprocess.STDOUT)
        started = time.perf_counter()
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.start_s = time.perf_counter() - started
        return self

    def _wait_ready(self) -> None:
        deadline = time.perf_counter() + READY_TIMEOUT_S
        with httpx.Client(timeout=2.0) as client:
            while time.perf_counter() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"server exited ({self.process.returncode}): {self.log.read_text()[-2000:]}")
                try:
                    if client.get(f"{self.url}/v2/health/ready").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)  # polling a subprocess's readiness: nothing to wait on instead
        raise RuntimeError(f"server not ready after {READY_TIMEOUT_S} s; see {self.log}")

    def __exit__(self, *exc: Any) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # drains accepted requests, then exits
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.handle.close()


@dataclass
class Plan:
    """Offered rates and SLO, shared by every configuration so they are compared at the same load.
    Unset values come from the first configuration (batching off, by default): low load = 20% of its
    saturation throughput, sweeps start at 50% of it, SLO = 5x its p50 at low load (>= 100 ms)."""

    low_rate: float | None
    start_rate: float | None
    slo_ms: float | None

    def fill(self, saturation: float) -> None:
        self.low_rate = self.low_rate or round(max(0.2 * saturation, 0.2), 2)
        self.start_rate = self.start_rate or round(max(0.5 * saturation, 0.5), 2)


def measure_config(name: str, extra: list[str], args: argparse.Namespace, plan: Plan, out: Path) -> dict[str, Any]:
    max_batch = int(option(extra, "--max-batch", "32"))
    instances = int(option(extra, "--instances", "1"))
    result: dict[str, Any] = {"config": name, "serve_options": extra, "loadavg_before": load_average(),
                              "max_batch": max_batch, "instances": instances}
    with Server(args.model, args.backend, args.precision, extra, out / f"server-{name}.log") as server:
        result["start_s"] = round(server.start_s, 1)
        base = dict(url=server.url, model=args.model, duration=args.duration, warmup=8,
                    min_requests=args.min_requests, images=list(args.images))
        log(f"[{name}] ready in {server.start_s:.0f} s at {server.url}")
        clients = max(4, 2 * max_batch * instances)
        for payload in ("tensor", "image"):
            row = run_load(LoadSettings(**base, slo_ms=1e9, concurrency=clients, payload=payload))
            result[f"saturation_{payload}"] = row
            log(f"[{name}] saturation, {payload}: {row['achieved_rate']}/s, batch {row['server'].get('avg_batch')}")
        plan.fill(result["saturation_tensor"]["achieved_rate"])
        low = run_load(LoadSettings(**base, slo_ms=plan.slo_ms or 1e9, rate=plan.low_rate, payload=args.payload))
        result["low_load"] = low
        log(f"[{name}] low load {plan.low_rate}/s: p50 {low['p50_ms']} ms, p99 {low['p99_ms']} ms")
        if plan.slo_ms is None:
            plan.slo_ms = max(100.0, 10.0 * math.ceil(5 * (low["p50_ms"] or 20.0) / 10.0))
            log(f"SLO for every sweep: p99 <= {plan.slo_ms:g} ms (5x the first configuration's p50 at low load)")
        result["slo_ms"] = plan.slo_ms
        result["sweep"] = run_sweep(LoadSettings(**base, slo_ms=plan.slo_ms, payload=args.payload),
                                    start_rate=plan.start_rate, factor=1.5, resolution=0.1,
                                    max_steps=args.max_steps,
                                    on_row=lambda row: log(f"[{name}] rate {row['rate']:.2f}/s: p99 {row['p99_ms']} "
                                                           f"ms, achieved {row['achieved_rate']}/s, "
                                                           f"{'held' if row['slo_met'] else 'missed'}"))
    result["loadavg_after"] = load_average()
    return result


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def bench_reference(args: argparse.Namespace, batches: list[int]) -> dict[int, float]:
    """images/s of the same runtime and precision from `bench`, per batch size (no server running)."""
    from inceptionlab.infer.bench import BenchSettings, Config, run_bench
    from inceptionlab.infer.source import load_source
    from inceptionlab.infer.runtimes import NATIVE_LAYOUT, RUNTIMES

    source = load_source(model=args.model, weights="random")
    layout = NATIVE_LAYOUT if RUNTIMES[args.backend].layouts == (NATIVE_LAYOUT,) else "nchw"
    report = run_bench(source, [Config(args.backend, args.precision, layout)],
                       BenchSettings(sorted(set(batches)), iters=args.bench_iters, warmup=5),
                       log=lambda m: print(m, file=sys.stderr, flush=True))
    return {row["batch"]: row["img_per_s"] for row in report.rows}


def summarize(results: list[dict[str, Any]], bench: dict[int, float]) -> list[dict[str, Any]]:
    base = next((r for r in results if r["config"] == "unbatched"), None)
    rows = []
    for r in results:
        best = r["sweep"]["best_rate"]
        tensor, image = r["saturation_tensor"], r["saturation_image"]
        reference = bench.get(r["max_batch"])
        row = {
            "config": r["config"], "low_rate": r["low_load"]["rate"],
            "low_p50_ms": r["low_load"]["p50_ms"], "low_p99_ms": r["low_load"]["p99_ms"],
            "best_rate": best, "best_p99_ms": r["sweep"]["best"]["p99_ms"] if r["sweep"]["best"] else None,
            "sat_tensor_per_s": tensor["achieved_rate"], "sat_batch": tensor["server"].get("avg_batch"),
            "sat_image_per_s": image["achieved_rate"],
            "decode_share": round(1 - image["achieved_rate"] / tensor["achieved_rate"], 3) if tensor["achieved_rate"] else None,
            "bench_img_per_s": reference,
            "overhead_ratio": round(tensor["achieved_rate"] / reference, 3) if reference else None,
            "loadavg": [r["loadavg_before"][0], r["loadavg_after"][0]],
        }
        if base is not None and base["sweep"]["best_rate"] and best:
            row["rate_vs_unbatched"] = round(best / base["sweep"]["best_rate"], 3)
        if base is not None and base["low_load"]["p99_ms"] and r["low_load"]["p99_ms"]:
            row["low_p99_vs_unbatched"] = round(r["low_load"]["p99_ms"] / base["low_load"]["p99_ms"], 3)
        rows.append(row)
    return rows


COLUMNS = [("config", "config"), ("low_p50_ms", "p50 ms at low load", ".1f"), ("low_p99_ms", "p99 ms at low load", ".1f"),
           ("low_p99_vs_unbatched", "p99 vs unbatched", ".2f"), ("best_rate", "highest rate holding the SLO, /s", ".1f"),
           ("rate_vs_unbatched", "vs unbatched", ".2f"), ("sat_tensor_per_s", "saturation, tensors/s", ".1f"),
           ("sat_batch", "avg batch", ".2f"), ("bench_img_per_s", "bench img/s, same batch", ".1f"),
           ("overhead_ratio", "server/bench", ".2f"), ("sat_image_per_s", "saturation, JPEG/s", ".1f"),
           ("decode_share", "decode share", ".0%"), ("loadavg", "load average before, after", ".1f")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="inception_v3")
    parser.add_argument("--backend", default="openvino", help="the best usable CPU runtime measured here")
    parser.add_argument("--precision", default="bf16", help="bf16: 99.7%% top-1 agreement with fp32 on the "
                                                             "trained run (README), 3-4x fp32's speed here")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of {', '.join(CONFIGS)}")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--slo-ms", type=float, default=None, help="p99 objective (default: 5x the first "
                                                                    "configuration's p50 at low load, >= 100 ms)")
    parser.add_argument("--low-rate", type=float, default=None, help="requests/s of the low-load runs "
                                                                      "(default: 20%% of the first configuration's "
                                                                      "saturation throughput)")
    parser.add_argument("--start-rate", type=float, default=None, help="first rate of each sweep (default: "
                                                                        "50%% of that throughput)")
    parser.add_argument("--max-steps", type=int, default=8, help="measurements per sweep at most")
    parser.add_argument("--min-requests", type=int, default=30, help="open-loop runs last until this many "
                                                                     "were due (slow servers: longer runs)")
    parser.add_argument("--payload", default="tensor", help="sweep payload: tensor (UINT8) or image (JPEG)")
    parser.add_argument("--images", type=Path, nargs="*", default=[], help="JPEGs to send (default: the "
                                                                          "sample pictures, else generated)")
    parser.add_argument("--bench-iters", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-serve"))
    args = parser.parse_args()
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"--configs {','.join(unknown)}: use {', '.join(CONFIGS)}")
    started = time.time()
    plan = Plan(args.low_rate, args.start_rate, args.slo_ms)
    results = [measure_config(name, CONFIGS[name], args, plan, args.out) for name in names]
    bench = bench_reference(args, [r["max_batch"] for r in results])
    rows = summarize(results, bench)
    path = write_result("serve", rows, settings={k: str(v) for k, v in vars(args).items()}, columns=COLUMNS,
                        title=f"`inceptionlab serve`: {args.model} on {args.backend} {args.precision}, payload "
                              f"{args.payload}, SLO p99 <= {plan.slo_ms:g} ms, low load {plan.low_rate}/s",
                        details={"plan": vars(plan), "seconds": round(time.time() - started),
                                 "bench_img_per_s": bench, "results": results})
    print(f"low load {plan.low_rate}/s; sweeps from {plan.start_rate}/s (x1.5, then bisection to 10%); "
          f"SLO p99 <= {plan.slo_ms:g} ms")
    print(render_file(path))


if __name__ == "__main__":
    main()
