"""Serving benchmark: the highest Poisson rate each serving configuration holds under a p99 SLO, over HTTP
and gRPC, and its saturation throughput against `bench`, measured in one run.

The configurations are the fixed plans that `serve --instances auto --max-batch auto` chooses from on
this machine (hardware.serve_plans: 1, 2, ... instances, one per CPU at most, x max batch 1 or 32; each
instance gets its share of the CPUs) and `auto` itself, decided afresh at start-up (`--calibrate`).
Each runs as its own `inceptionlab serve` subprocess on 127.0.0.1 with an HTTP and a gRPC port; for
each protocol, with the loadtest library:

1. saturation: a closed loop (2 x max batch x instances clients, at least 4) of preprocessed UINT8
   tensors, and over HTTP of JPEG files too: the server's throughput and the share decoding costs;
2. low load: an open-loop Poisson run at --low-rate (p50/p99 when batches rarely form);
3. sweep: the highest Poisson rate whose p99 stays <= the SLO (rate x1.5 until it fails, then bisect).

Then the server stops (SIGTERM) and, last, `bench` times the same runtime and precision in this process
at each max batch (no server running): server/bench = saturation with tensors / bench images/s at the
same batch size, what HTTP or gRPC, parsing, batching and the event loop cost.

Targets (2 CPUs): `auto` holds at least the rate of the best fixed plan, and gRPC's saturation
throughput is at least HTTP's; the summary under the table says whether each held in this run.

    python benchmarks/serve.py                                   # ~15 minutes on 2 cores
    python benchmarks/serve.py --duration 10 --configs 1x1,auto --protocols grpc

Latency does not depend on the weights' values: random weights (seed 0) are used. The load generator
shares the cores with the server; its own CPU use is in each row of the result file, and the load
average before and after each configuration is in the table (other processes distort every figure).
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
from inceptionlab import hardware
from inceptionlab.loadtest.generator import LoadSettings, run_load, run_sweep

PROTOCOLS = ("http", "grpc")
READY_TIMEOUT_S = 900  # first start exports Inception v3, compiles each batch size, checks reduced precisions


def fixed_configs(cpus: int) -> dict[str, list[str]]:
    """name -> `serve` options: each plan auto measures on this machine, pinned."""
    return {plan.label: ["--instances", str(plan.instances), "--max-batch", str(plan.max_batch)]
            for plan in hardware.serve_plans(cpus, gpu=False, instances=None, max_batch=None)}


def all_configs(cpus: int) -> dict[str, list[str]]:
    return {**fixed_configs(cpus), "auto": ["--instances", "auto", "--max-batch", "auto", "--max-delay-ms", "auto",
                                            "--calibrate"]}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def load_average() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Server:
    """`inceptionlab serve` in a subprocess with both front ends; a context manager that always stops it."""

    def __init__(self, model: str, backend: str, precision: str, extra: list[str], log_path: Path):
        self.port, self.grpc_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "inceptionlab", "serve", "--model", model, "--weights", "random",
                        "--backend", backend, "--precision", precision, "--port", str(self.port),
                        "--grpc-port", str(self.grpc_port), *extra]
        self.log = log_path

    def address(self, protocol: str) -> str:
        return self.url if protocol == "http" else f"127.0.0.1:{self.grpc_port}"

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

    def served_as(self, model: str) -> dict[str, Any]:
        """What the server decided: backend, precision, instances, max batch and delay (its model config)."""
        config = httpx.get(f"{self.url}/v2/models/{model}/config", timeout=10).json()
        params = config.get("parameters", {})
        return {"backend": config.get("backend"), "precision": params.get("precision", {}).get("string_value"),
                "instances": config["instance_group"][0]["count"], "max_batch": config["max_batch_size"],
                "max_delay_ms": config["dynamic_batching"]["max_queue_delay_microseconds"] / 1000}

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
    """Offered rates and SLO, shared by every configuration and protocol so they are compared at the same
    load. Unset values come from the first measurement (the first configuration over the first protocol):
    low load = 20% of its saturation throughput, sweeps start at 50% of it, SLO = 5x its p50 at low load
    (>= 100 ms)."""

    low_rate: float | None
    start_rate: float | None
    slo_ms: float | None

    def fill(self, saturation: float) -> None:
        self.low_rate = self.low_rate or round(max(0.2 * saturation, 0.2), 2)
        self.start_rate = self.start_rate or round(max(0.5 * saturation, 0.5), 2)

    def fill_slo(self, low_p50_ms: float | None) -> None:
        if self.slo_ms is None:
            self.slo_ms = max(100.0, 10.0 * math.ceil(5 * (low_p50_ms or 20.0) / 10.0))
            log(f"SLO for every sweep: p99 <= {self.slo_ms:g} ms (5x the first configuration's p50 at low load)")


def measure_protocol(name: str, server: Server, protocol: str, args: argparse.Namespace, plan: Plan,
                     clients: int) -> dict[str, Any]:
    """Saturation, low load and the SLO sweep of one configuration over one protocol."""
    tag = f"[{name} {protocol}]"
    base = dict(url=server.address(protocol), protocol=protocol, model=args.model, duration=args.duration,
                warmup=8, min_requests=args.min_requests, images=list(args.images))
    result: dict[str, Any] = {}
    for payload in ("tensor", "image") if protocol == "http" else ("tensor",):
        row = run_load(LoadSettings(**base, slo_ms=1e9, concurrency=clients, payload=payload))
        result[f"saturation_{payload}"] = row
        log(f"{tag} saturation, {payload}: {row['achieved_rate']}/s, batch {row['server'].get('avg_batch')}")
    plan.fill(result["saturation_tensor"]["achieved_rate"])
    low = run_load(LoadSettings(**base, slo_ms=plan.slo_ms or 1e9, rate=plan.low_rate, payload=args.payload))
    result["low_load"] = low
    log(f"{tag} low load {plan.low_rate}/s: p50 {low['p50_ms']} ms, p99 {low['p99_ms']} ms")
    plan.fill_slo(low["p50_ms"])
    result["sweep"] = run_sweep(LoadSettings(**base, slo_ms=plan.slo_ms, payload=args.payload),
                                start_rate=plan.start_rate, factor=1.5, resolution=0.1, max_steps=args.max_steps,
                                on_row=lambda row: log(f"{tag} rate {row['rate']:.2f}/s: p99 {row['p99_ms']} ms, "
                                                       f"achieved {row['achieved_rate']}/s, "
                                                       f"{'held' if row['slo_met'] else 'missed'}"))
    return result


def measure_config(name: str, extra: list[str], args: argparse.Namespace, plan: Plan, out: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"config": name, "serve_options": extra, "loadavg_before": load_average()}
    with Server(args.model, args.backend, args.precision, extra, out / f"server-{name}.log") as server:
        result["start_s"] = round(server.start_s, 1)
        result["served_as"] = served = server.served_as(args.model)
        log(f"[{name}] ready in {server.start_s:.0f} s at {server.url} and 127.0.0.1:{server.grpc_port}: {served}")
        clients = max(4, 2 * served["max_batch"] * served["instances"])
        result["protocols"] = {protocol: measure_protocol(name, server, protocol, args, plan, clients)
                               for protocol in args.protocols}
    result["loadavg_after"] = load_average()
    return result


def bench_reference(args: argparse.Namespace, served: dict[str, Any], batches: list[int]) -> dict[int, float]:
    """images/s of the runtime and precision the servers used, per batch size, in this process (no server
    running): the ceiling a server at saturation is compared with."""
    from inceptionlab.infer.bench import BenchSettings, Config, run_bench
    from inceptionlab.infer.runtimes import NATIVE_LAYOUT, RUNTIMES
    from inceptionlab.infer.source import load_source

    source = load_source(model=args.model, weights="random")
    backend, precision = served["backend"], served["precision"]
    layout = NATIVE_LAYOUT if RUNTIMES[backend].layouts == (NATIVE_LAYOUT,) else "nchw"
    report = run_bench(source, [Config(backend, precision, layout)],
                       BenchSettings(sorted(set(batches)), iters=args.bench_iters, warmup=5), log=log)
    return {row["batch"]: row["img_per_s"] for row in report.rows}


def summarize(results: list[dict[str, Any]], bench: dict[int, float]) -> list[dict[str, Any]]:
    """One row per configuration and protocol; ratios against the unbatched plan over the same protocol."""
    rows = []
    for r in results:
        served = r["served_as"]
        for protocol, m in r["protocols"].items():
            base = next((x["protocols"].get(protocol) for x in results if x["config"] == "1x1"), None)
            best = m["sweep"]["best_rate"]
            tensor, image = m["saturation_tensor"], m.get("saturation_image")
            reference = bench.get(served["max_batch"])
            row = {
                "config": r["config"], "protocol": protocol,
                "plan": f"{served['instances']}x{served['max_batch']}, {served['max_delay_ms']:g} ms",
                "precision": f"{served['backend']} {served['precision']}",
                "low_p50_ms": m["low_load"]["p50_ms"], "low_p99_ms": m["low_load"]["p99_ms"],
                "best_rate": best, "best_p99_ms": m["sweep"]["best"]["p99_ms"] if m["sweep"]["best"] else None,
                "sat_tensor_per_s": tensor["achieved_rate"], "sat_batch": tensor["server"].get("avg_batch"),
                "sat_image_per_s": image["achieved_rate"] if image else None,
                "decode_share": (round(1 - image["achieved_rate"] / tensor["achieved_rate"], 3)
                                 if image and tensor["achieved_rate"] else None),
                "bench_img_per_s": reference,
                "overhead_ratio": round(tensor["achieved_rate"] / reference, 3) if reference else None,
                "client_cpu": tensor.get("client_cpu"),
                "loadavg": [r["loadavg_before"][0], r["loadavg_after"][0]],
            }
            if base is not None and base["sweep"]["best_rate"] and best:
                row["rate_vs_unbatched"] = round(best / base["sweep"]["best_rate"], 3)
            rows.append(row)
    return rows


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's two targets, checked on this run's rows."""
    checks = []
    for protocol in PROTOCOLS:
        fixed = [r for r in rows if r["protocol"] == protocol and r["config"] != "auto" and r["best_rate"]]
        auto = next((r for r in rows if r["protocol"] == protocol and r["config"] == "auto"), None)
        if fixed and auto:
            best = max(fixed, key=lambda r: r["best_rate"])
            checks.append({"target": f"{protocol}: auto's rate >= the best fixed plan's",
                           "measured": f"auto {auto['best_rate'] or 0:.1f}/s, best fixed {best['config']} "
                                       f"{best['best_rate']:.1f}/s",
                           "held": (auto["best_rate"] or 0) >= best["best_rate"]})
    for config in dict.fromkeys(r["config"] for r in rows):
        by = {r["protocol"]: r for r in rows if r["config"] == config}
        if set(PROTOCOLS) <= set(by):
            http, grpc = by["http"]["sat_tensor_per_s"], by["grpc"]["sat_tensor_per_s"]
            checks.append({"target": f"{config}: gRPC saturation >= HTTP's",
                           "measured": f"gRPC {grpc:.1f}/s, HTTP {http:.1f}/s", "held": grpc >= http})
    return checks


COLUMNS = [("config", "config"), ("protocol", "protocol"), ("plan", "instances x max batch, delay"),
           ("precision", "runtime"), ("low_p50_ms", "p50 ms at low load", ".1f"),
           ("low_p99_ms", "p99 ms at low load", ".1f"), ("best_rate", "highest rate holding the SLO, /s", ".1f"),
           ("rate_vs_unbatched", "vs 1x1", ".2f"), ("sat_tensor_per_s", "saturation, tensors/s", ".1f"),
           ("sat_batch", "avg batch", ".2f"), ("bench_img_per_s", "bench img/s, same batch", ".1f"),
           ("overhead_ratio", "server/bench", ".2f"), ("sat_image_per_s", "saturation, JPEG/s", ".1f"),
           ("decode_share", "decode share", ".0%"), ("client_cpu", "client CPU, cores", ".2f"), ("loadavg", "load average before, after", ".1f")]


def parse_args(cpus: int) -> argparse.Namespace:
    configs = all_configs(cpus)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="inception_v3")
    parser.add_argument("--backend", default="auto", help="as `serve --backend` (auto: OpenVINO on a CPU when "
                                                          "installed, else ONNX Runtime)")
    parser.add_argument("--precision", default="auto", help="as `serve --precision` (auto: bf16 only where the "
                                                            "CPU has bf16 units and it agrees with fp32)")
    parser.add_argument("--configs", default=",".join(configs), help=f"comma list of {', '.join(configs)} "
                                                                     "(the plans auto chooses from here, and auto)")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS), help="comma list of http, grpc")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--slo-ms", type=float, default=None, help="p99 objective (default: 5x the first "
                                                                    "configuration's p50 at low load, >= 100 ms)")
    parser.add_argument("--low-rate", type=float, default=None, help="requests/s of the low-load runs "
                                                                      "(default: 20%% of the first measured "
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
    args.names = [n.strip() for n in args.configs.split(",") if n.strip()]
    args.protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    unknown = [n for n in args.names if n not in configs] + [p for p in args.protocols if p not in PROTOCOLS]
    if unknown:
        parser.error(f"{','.join(unknown)}: --configs takes {', '.join(configs)}; --protocols http, grpc")
    args.config_options = configs
    return args


def main() -> None:
    cpus = hardware.usable_cpus()
    args = parse_args(cpus)
    started = time.time()
    plan = Plan(args.low_rate, args.start_rate, args.slo_ms)
    results = [measure_config(name, args.config_options[name], args, plan, args.out) for name in args.names]
    bench = bench_reference(args, results[0]["served_as"], [r["served_as"]["max_batch"] for r in results])
    rows = summarize(results, bench)
    checks = targets(rows)
    path = write_result("serve", rows, settings={k: str(v) for k, v in vars(args).items() if k != "config_options"},
                        columns=COLUMNS,
                        title=f"`inceptionlab serve`: {args.model}, payload {args.payload}, SLO p99 <= "
                              f"{plan.slo_ms:g} ms, low load {plan.low_rate}/s, {cpus} CPUs",
                        details={"plan": vars(plan), "seconds": round(time.time() - started), "targets": checks,
                                 "bench_img_per_s": bench, "results": results})
    print(f"low load {plan.low_rate}/s; sweeps from {plan.start_rate}/s (x1.5, then bisection to 10%); "
          f"SLO p99 <= {plan.slo_ms:g} ms")
    print(render_file(path))
    for check in checks:
        print(f"{'held' if check['held'] else 'MISSED'}: {check['target']} ({check['measured']})")


if __name__ == "__main__":
    main()
