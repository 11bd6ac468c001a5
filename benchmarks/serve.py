"""Serving benchmark: the highest Poisson rate each serving configuration holds under a p99 SLO, over HTTP
and gRPC, its saturation throughput against `bench`, and a peer server on the same export, measured in
one run, for each model asked for.

Models (`--models`): `demo`, the demo's Inception v3 at 80 px (small per-image cost: the server's own
work per request, and any stall, shows), and pretrained ones at their own size (`inception_v3`: 299 px,
where inference dominates). The demo run is `--demo-run RUN_DIR`, else the demo trained here as `make demo`
trains it (pretrained models get random weights, seed 0: their latency does not depend on them).

The configurations are the fixed plans that `serve --instances auto --max-batch auto` chooses from on
this machine (hardware.serve_plans: 1, 2, ... instances, one per CPU at most, x max batch 1 or 32; each
instance gets its share of the CPUs) and `auto` itself, decided afresh at start-up (`--calibrate`) for the
run's SLO (`--slo-ms`). Each runs as its own `inceptionlab serve` subprocess on 127.0.0.1 with an HTTP and
a gRPC port; for each protocol, with the loadtest library:

1. saturation: a closed loop (2 x max batch x instances clients, at least 4) of preprocessed UINT8
   tensors, and over HTTP of JPEG files too: the server's throughput and the share decoding costs;
2. low load: an open-loop Poisson run at --low-rate (p50/p99 when batches rarely form);
3. sweep: the highest Poisson rate whose p99 stays <= the SLO (rate x1.5 until it fails, then bisect).

Then the server stops (SIGTERM) and `bench` times the same runtime and precision in this process at each
max batch (no server running): server/bench = saturation with tensors / bench images/s at the same batch
size, what HTTP or gRPC, parsing, batching and the event loop cost.

The peer (`--peer litserve`): LitServe + ONNX Runtime on the model's own ONNX export
(benchmarks/litserve_peer.py), the server a user would assemble. It, `auto` and `max-batch-1` (auto's
instances, unbatched; `--peer-configs` adds fixed plans) run side by side, and the same client sends each
the same pictures at the same Poisson rates in each body of `--bodies`: the protocol's plain JSON form
(base64, the one both read), the image file as the body (`raw`: what a web page or a phone sends; ours at
/v1/classify), and a form with the file (`multipart`); LitServe reads no raw body (it parses every other
body as JSON), so against our raw bodies it gets the form. Each gets a low-load run, then the SLO sweep,
`--repeat` times, alternating servers and bodies, so each repetition of one meets the same machine as its
twins. A sweep rises x1.5 until the SLO fails, then bisects to `--resolution` (5%).

Targets: `auto` holds at least the rate of the best fixed plan (or serves that plan); gRPC's saturation
throughput is within 15% of HTTP's or above; on the demo model, in every repetition, `auto`'s SLO rate is
at least 2x the peer's (for raw bodies: against the peer's multipart) and, on raw bodies, at least 1.3x
`max-batch-1`'s; and the rate `auto`'s start-up line predicts for its plan is within 20% of the median
measured on raw bodies. The summary under the table says whether each held in this run.

    python benchmarks/serve.py                                   # both models, the peer: ~40 minutes on 2 cores
    python benchmarks/serve.py --models demo --configs auto --protocols http --repeat 3
    python benchmarks/serve.py --models inception_v3 --duration 10 --configs 1x1,auto --protocols grpc --peer none
    python benchmarks/serve.py --models demo --configs auto --peer-configs auto,1x32,2x32 --repeat 2   # plans vs peer
    python benchmarks/serve.py --models demo --configs auto --protocols http --bodies raw --repeat 3   # issue 40

The load generator shares the cores with the server; its own CPU use is in each row of the result file,
and the load average before and after each configuration is in the table (other processes distort every
figure).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import re
import statistics
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from _results import render_file, write_result  # this folder's sibling modules
from _servers import checkout_env, free_port, stop_gracefully, wait_until_ready
from inceptionlab import hardware
from inceptionlab.loadtest.generator import LoadSettings, run_load, run_sweep
from inceptionlab.loadtest.payloads import FILE_BODIES

PROTOCOLS = ("http", "grpc")
PEERS = ("litserve", "none")
# Request bodies of the side-by-side runs: the protocol's plain JSON form (base64 images), the image file as
# the body (what a web page or a phone sends; ours reads it at /v1/classify), and a form with the file. The
# peer reads JSON and forms: LitServe parses every other body as JSON, so against our raw bodies it gets the
# form, a LitServe user's way to take a file upload.
BODIES = ("json", "raw", "multipart")
PEER_BODIES = {"json": "json", "raw": "multipart", "multipart": "multipart"}
BATCHING_TARGET = 1.3  # auto's SLO rate against the same server unbatched (--max-batch 1), raw bodies, demo
PREDICTION_TOLERANCE = 0.2  # auto's start-up line's predicted rate against the rate measured, raw bodies
PEER_SCRIPT = Path(__file__).resolve().with_name("litserve_peer.py")
PEER_TARGET = 2.0  # the demo model: our SLO rate at least this multiple of the peer's, every repetition
# gRPC's saturation against HTTP's, one plan: the gRPC front end must not be the slower one, within what
# two closed-loop runs of one plan differ by. On a 2-core AMD EPYC (Zen 4), one run: the demo's 1 x 32
# gave 570 and 522 tensors/s over gRPC (pinned, and as auto), Inception v3 at 299 px 1 x 32 12.6/s over
# gRPC against 14.8/s over HTTP, with 3 batches of 25 in each 5 s window.
GRPC_VS_HTTP = 0.85


def fixed_configs(cpus: int) -> dict[str, list[str]]:
    """name -> `serve` options: each plan auto measures on this machine, pinned."""
    return {plan.label: ["--instances", str(plan.instances), "--max-batch", str(plan.max_batch)]
            for plan in hardware.serve_plans(cpus, gpu=False, instances=None, max_batch=None)}


def all_configs(cpus: int) -> dict[str, list[str]]:
    """Every configuration: the fixed plans, auto, and auto's instances unbatched (`max-batch-1`, what
    batching is judged against)."""
    return {**fixed_configs(cpus), "auto": ["--instances", "auto", "--max-batch", "auto", "--max-delay-ms", "auto",
                                            "--calibrate"],
            "max-batch-1": ["--instances", "auto", "--max-batch", "1", "--calibrate"]}


def predicted(log_text: str) -> dict[str, Any] | None:
    """The chosen plan and the rate its start-up line predicts within the objective (the first model's),
    or None when the line has none (a pinned plan, nothing timed)."""
    chosen = re.search(r"serving plan: (\d+) instance\(s\).*?max batch (\d+)", log_text)
    if not chosen:
        return None
    plan = f"{chosen.group(1)}x{chosen.group(2)}"
    rate = re.search(rf"simulated from batch times[^:]*:.*?\b{plan} ([\d.]+)/s", log_text[chosen.start():])
    return {"plan": plan, "rate": float(rate.group(1))} if rate else None


def load_average() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Target:
    """A model to serve: its name on the server, and how `serve`, `export` and `bench` find it."""

    name: str
    run_dir: Path | None = None  # else a pretrained model of this name, random weights

    @property
    def source_args(self) -> list[str]:
        return [f"{self.name}={self.run_dir}"] if self.run_dir else ["--model", self.name, "--weights", "random"]

    def export_args(self, out: Path) -> list[str]:
        return [str(self.run_dir)] if self.run_dir else ["--model", self.name, "--weights", "random", "--out", str(out)]


def demo_run(args: argparse.Namespace) -> Path:
    """--demo-run, else the newest demo run under --out, else the demo trained there."""
    if args.demo_run is not None:
        return args.demo_run
    runs = args.out / "demo-run"
    trained = sorted(path.parent for path in runs.glob("*/*/*/model.pt"))
    if not trained:
        options, why = demo_training(args.precision)
        log(f"training the demo model into {runs}: {why}")
        subprocess.run([sys.executable, "-m", "inceptionlab", "demo", *options,
                        "--out", str(runs), "--data", str(runs / "data"), "--samples", "1", "--no-progress"],
                       check=True, stdout=subprocess.DEVNULL)
        trained = sorted(path.parent for path in runs.glob("*/*/*/model.pt"))
    return trained[-1]


def demo_training(precision: str) -> tuple[list[str], str]:
    """The `inceptionlab demo` options that train the demo model the servers will serve, and why.

    Under `--precision auto` the weights decide what is served: bf16 only where it agrees with fp32 on
    >= 99% of held-out images. On a 2-core AMD EPYC (Zen 4) the demo trained for one epoch agreed on
    97.5% and was served fp32, the demo as `make demo` trains it (5 epochs) on 99.5%, served bf16: a
    benchmark of the first measures a server no user of that machine runs. A pinned precision makes
    latency independent of the weights, and one epoch does."""
    if precision == "auto":
        return [], "as `make demo` trains it (auto's precision depends on the weights: bf16 must agree with fp32)"
    return ["--set", "train.epochs=1"], f"one epoch (--precision {precision}: latency does not depend on the weights)"


def targets_of(args: argparse.Namespace) -> list[Target]:
    return [Target(name, demo_run(args)) if name == "demo" else Target(name) for name in args.models]


class Server:
    """`inceptionlab serve` in a subprocess with both front ends; a context manager that always stops it."""

    own_group = False  # a process group of its own, stopped as a whole (a server that starts processes)

    def __init__(self, target: Target, backend: str, precision: str, extra: list[str], log_path: Path,
                 env: dict[str, str] | None = None):
        self.port, self.grpc_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "inceptionlab", "serve", *target.source_args,
                        "--backend", backend, "--precision", precision, "--port", str(self.port),
                        "--grpc-port", str(self.grpc_port), *extra]
        self.log = log_path
        self.env = env  # --server-src: the servers' inceptionlab from another checkout

    def address(self, protocol: str) -> str:
        return self.url if protocol == "http" else f"127.0.0.1:{self.grpc_port}"

    def __enter__(self) -> "Server":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(self.log, "w")
        self.process = subprocess.Popen(self.command, stdout=self.handle, stderr=subprocess.STDOUT,
                                        start_new_session=self.own_group, env=self.env)
        started = time.perf_counter()
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.start_s = time.perf_counter() - started
        self.prediction = predicted(self.log.read_text(errors="replace"))
        return self

    def _wait_ready(self) -> None:
        wait_until_ready(f"{self.url}/v2/health/ready", self.process, self.log)

    def served_as(self, model: str) -> dict[str, Any]:
        """What the server decided: backend, precision, instances, max batch and delay (its model config)."""
        config = httpx.get(f"{self.url}/v2/models/{model}/config", timeout=10).json()
        params = config.get("parameters", {})
        return {"backend": config.get("backend"), "precision": params.get("precision", {}).get("string_value"),
                "instances": config["instance_group"][0]["count"],
                "max_batch": max(config["dynamic_batching"]["preferred_batch_size"]),  # the plan's batch
                "max_delay_ms": config["dynamic_batching"]["max_queue_delay_microseconds"] / 1000,
                "predicted": self.prediction}

    def __exit__(self, *exc: Any) -> None:
        stop_gracefully(self.process, timeout_s=60)
        self.handle.close()


class Peer(Server):
    """benchmarks/litserve_peer.py (LitServe + ONNX Runtime) on the target's ONNX export, in a subprocess."""

    own_group = True  # LitServe runs its inference workers and its HTTP server as processes of their own

    def __init__(self, target: Target, onnx: Path, max_batch: int, batch_timeout_s: float, log_path: Path):
        self.port, self.grpc_port = free_port(), None
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, str(PEER_SCRIPT), "--onnx", str(onnx), "--name", target.name,
                        "--port", str(self.port), "--max-batch", str(max_batch),
                        "--batch-timeout", str(batch_timeout_s)]
        self.log, self.env = log_path, None
        self.max_batch = max_batch
        self.prediction = None

    def _wait_ready(self) -> None:
        wait_until_ready(f"{self.url}/health", self.process, self.log)  # LitServe's: ok once its workers run

    def served_as(self, model: str) -> dict[str, Any]:
        return {"backend": "litserve onnxruntime", "precision": "fp32", "instances": 1, "max_batch": self.max_batch,
                "max_delay_ms": None, "predicted": None}

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # workers that outlived their parent: its group only
        except ProcessLookupError:
            pass


def export_onnx(target: Target, out: Path) -> Path:
    """The target's ONNX export (`inceptionlab export`, checked against PyTorch), what the peer serves."""
    done = subprocess.run([sys.executable, "-m", "inceptionlab", "export", *target.export_args(out / "exports"),
                           "--json"], check=True, capture_output=True, text=True)
    return Path(json.loads(done.stdout.strip().splitlines()[-1])["path"])


def peer_missing() -> str | None:
    """Why the peer cannot run here, or None."""
    for module in ("litserve", "onnxruntime"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install litserve onnxruntime)"
    return None


@dataclass
class Plan:
    """Offered rates and SLO, shared by every configuration and protocol of one model so they are compared
    at the same load. Unset values come from the model's first measurement (the first configuration over
    the first protocol): low load = 20% of its saturation throughput, sweeps start at 50% of it, SLO = 5x
    its p50 at low load (>= 100 ms)."""

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


def load_base(target: Target, server: Server, protocol: str, args: argparse.Namespace) -> dict[str, Any]:
    return dict(url=server.address(protocol), protocol=protocol, model=target.name, duration=args.duration,
                warmup=8, min_requests=args.min_requests, images=list(args.images))


def sweep(settings: LoadSettings, plan: Plan, args: argparse.Namespace, tag: str) -> dict[str, Any]:
    return run_sweep(settings, start_rate=plan.start_rate, factor=1.5, resolution=args.resolution,
                     max_steps=args.max_steps,
                     on_row=lambda row: log(f"{tag} rate {row['rate']:.2f}/s: p99 {row['p99_ms']} ms, "
                                            f"achieved {row['achieved_rate']}/s, "
                                            f"{'held' if row['slo_met'] else 'missed'}"))


def measure_protocol(target: Target, name: str, server: Server, protocol: str, args: argparse.Namespace, plan: Plan,
                     clients: int) -> dict[str, Any]:
    """Saturation, low load and the SLO sweep of one configuration over one protocol."""
    tag = f"[{target.name} {name} {protocol}]"
    base = load_base(target, server, protocol, args)
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
    result["sweep"] = sweep(LoadSettings(**base, slo_ms=plan.slo_ms, payload=args.payload), plan, args, tag)
    return result


def config_options(name: str, args: argparse.Namespace, plan: Plan) -> list[str]:
    """`serve` options of a configuration; `auto` chooses its plan for this run's SLO once it is known
    (with --server-src, for its own default objective: a checkout may predate --slo-ms)."""
    extra = list(args.config_options[name])
    return [*extra, "--slo-ms", f"{plan.slo_ms:g}"] if name == "auto" and plan.slo_ms and not args.server_src \
        else extra


def measure_config(target: Target, name: str, args: argparse.Namespace, plan: Plan, out: Path) -> dict[str, Any]:
    extra = config_options(name, args, plan)
    result: dict[str, Any] = {"model": target.name, "config": name, "serve_options": extra,
                              "loadavg_before": load_average()}
    with Server(target, args.backend, args.precision, extra, out / f"server-{target.name}-{name}.log",
                checkout_env(args.server_src)) as server:
        result["start_s"] = round(server.start_s, 1)
        result["served_as"] = served = server.served_as(target.name)
        log(f"[{target.name} {name}] ready in {server.start_s:.0f} s at {server.url} and 127.0.0.1:{server.grpc_port}: "
            f"{served}")
        clients = max(4, 2 * served["max_batch"] * served["instances"])
        result["protocols"] = {protocol: measure_protocol(target, name, server, protocol, args, plan, clients)
                               for protocol in args.protocols}
    result["loadavg_after"] = load_average()
    return result


def ours_name(config: str) -> str:
    """Our server's name in the side-by-side run: `inceptionlab` as `serve` plans it, else with its fixed plan."""
    return "inceptionlab" if config == "auto" else f"inceptionlab {config}"


def measure_against_peer(target: Target, args: argparse.Namespace, plan: Plan, out: Path) -> list[dict[str, Any]]:
    """`auto` (and --peer-configs' other configurations) and the peer side by side, the same requests at the
    same rates in each body of --bodies: a low-load run, then the SLO sweep, `--repeat` times, alternating
    servers and bodies, so each repetition of one meets the same machine as its twins. One comparison per
    body; against our raw bodies the peer's row is its multipart one (it reads no raw body)."""
    onnx = export_onnx(target, out)
    options = {config: config_options(config, args, plan) for config in args.peer_configs}
    before = load_average()
    with contextlib.ExitStack() as running:
        servers: dict[str, Server] = {
            ours_name(config): running.enter_context(Server(
                target, args.backend, args.precision, extra, out / f"server-{target.name}-{config}-vs-peer.log",
                checkout_env(args.server_src))) for config, extra in options.items()}
        servers[args.peer] = running.enter_context(Peer(target, onnx, args.peer_max_batch, args.peer_batch_timeout_ms / 1e3,
                                                        out / f"peer-{target.name}.log"))
        served = {who: server.served_as(target.name) for who, server in servers.items()}
        records: dict[tuple[str, str], dict[str, Any]] = {}
        for repetition in range(args.repeat):
            for body in args.bodies:
                for who, server in servers.items():
                    sent = PEER_BODIES[body] if who == args.peer else body
                    if (who, sent) in records and len(records[who, sent]["sweeps"]) > repetition:
                        continue  # the peer's multipart run serves both the raw and the multipart comparison
                    record = records.setdefault((who, sent), {"served_as": served[who], "body": sent,
                                                              "start_s": round(server.start_s, 1),
                                                              "low_load": None, "sweeps": []})
                    tag = f"[{target.name} {who}, {sent} #{repetition + 1}]"
                    base = {**load_base(target, server, "http", args), "payload": "image", "body": sent,
                            "seed": repetition}
                    if who == args.peer and sent in FILE_BODIES:
                        base["path"] = "/v2/models/{model}/infer"  # the peer's one route takes forms too
                    if repetition == 0:
                        record["low_load"] = low = run_load(LoadSettings(**base, slo_ms=plan.slo_ms, rate=plan.low_rate))
                        log(f"{tag} low load {plan.low_rate}/s: p50 {low['p50_ms']} ms, p99 {low['p99_ms']} ms")
                    record["sweeps"].append(sweep(LoadSettings(**base, slo_ms=plan.slo_ms), plan, args, tag))
    after = load_average()
    return [{"model": target.name, "body": body, "onnx": str(onnx), "peer": args.peer,
             "serve_options": {ours_name(c): o for c, o in options.items()}, "loadavg_before": before,
             "loadavg_after": after,
             "servers": {who: records[who, PEER_BODIES[body] if who == args.peer else body] for who in servers}}
            for body in args.bodies]


def bench_reference(target: Target, args: argparse.Namespace, served: dict[str, Any],
                    batches: list[int]) -> dict[int, float]:
    """images/s of the runtime and precision the servers used, per batch size, in this process (no server
    running): the ceiling a server at saturation is compared with."""
    from inceptionlab.infer.bench import BenchSettings, Config, run_bench
    from inceptionlab.infer.runtimes import NATIVE_LAYOUT, RUNTIMES
    from inceptionlab.infer.source import load_source

    source = load_source(run_dir=target.run_dir) if target.run_dir else load_source(model=target.name, weights="random")
    backend, precision = served["backend"], served["precision"]
    layout = NATIVE_LAYOUT if RUNTIMES[backend].layouts == (NATIVE_LAYOUT,) else "nchw"
    report = run_bench(source, [Config(backend, precision, layout)],
                       BenchSettings(sorted(set(batches)), iters=args.bench_iters, warmup=5), log=log)
    return {row["batch"]: row["img_per_s"] for row in report.rows}


def summarize(results: list[dict[str, Any]], bench: dict[str, dict[int, float]]) -> list[dict[str, Any]]:
    """One row per model, configuration and protocol; ratios against the unbatched plan over the same protocol."""
    rows = []
    for r in results:
        served = r["served_as"]
        for protocol, m in r["protocols"].items():
            base = next((x["protocols"].get(protocol) for x in results
                         if x["config"] == "1x1" and x["model"] == r["model"]), None)
            best = m["sweep"]["best_rate"]
            tensor, image = m["saturation_tensor"], m.get("saturation_image")
            reference = bench.get(r["model"], {}).get(served["max_batch"])
            row = {
                "model": r["model"], "config": r["config"], "protocol": protocol,
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


def rate_held(sweep_result: dict[str, Any]) -> tuple[float, bool]:
    """A sweep's highest rate holding the SLO, and whether one held. A sweep that held none of the rates
    it tried (it steps down 3 times from the start) gives the lowest rate tried, with False: the rate
    it holds is below that, an upper bound, never 0, which would make a ratio against it infinite."""
    if sweep_result["best_rate"]:
        return sweep_result["best_rate"], True
    return min(row["rate"] for row in sweep_result["rows"]), False


def rate_text(rate: float, held: bool) -> str:
    return f"{rate:.1f}" if held else f"<{rate:.1f}"


def peer_rows(comparisons: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per model, server and body of the side-by-side runs: the SLO rate of every repetition (a
    repetition that held no rate tried counts as the lowest tried in the median, and reads "<R"). The peer's
    multipart record, which stands against our raw bodies too, is one row."""
    rows = []
    for c in comparisons:
        for who, record in c["servers"].items():
            if record.get("body", c.get("body", "json")) != c.get("body", "json"):
                continue  # the peer's record of another body (its multipart, against our raw): its own row
            served = record["served_as"]
            held = [rate_held(s) for s in record["sweeps"]]
            delay = f", {served['max_delay_ms']:g} ms" if served["max_delay_ms"] is not None else ""
            prediction = served.get("predicted")
            rows.append({"model": c["model"], "config": f"{who}, {BODY_WORDS[c.get('body', 'json')]}",
                         "protocol": "http", "plan": f"{served['instances']}x{served['max_batch']}{delay}",
                         "precision": f"{served['backend']} {served['precision']}",
                         "low_p50_ms": record["low_load"]["p50_ms"], "low_p99_ms": record["low_load"]["p99_ms"],
                         "best_rate": statistics.median(r for r, _ in held) if held else None,
                         "rates": [r if ok else rate_text(r, ok) for r, ok in held],
                         "predicted_rate": prediction["rate"] if prediction else None,
                         "loadavg": [c["loadavg_before"][0], c["loadavg_after"][0]]})
    return rows


BODY_WORDS = {"json": "JSON images", "raw": "raw image bodies", "multipart": "multipart images"}


def plan_shape(plan: str) -> str:
    """"2x1, 0 ms" -> "2x1": instances x max batch (auto's max delay may differ from a pinned plan's)."""
    return plan.split(",")[0].strip()


def targets(rows: list[dict[str, Any]], comparisons: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The targets, checked on this run's rows."""
    checks = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model and "rates" not in r]
        for protocol in PROTOCOLS:
            fixed = [r for r in mine if r["protocol"] == protocol and r["config"] != "auto" and r["best_rate"]]
            auto = next((r for r in mine if r["protocol"] == protocol and r["config"] == "auto"), None)
            if fixed and auto:
                best = max(fixed, key=lambda r: r["best_rate"])
                # auto serving the best fixed plan itself held it: two sweeps of one plan differ by
                # their noise (2x1 over gRPC swept to 70.6/s as auto, 78.2/s pinned, in one run).
                same = plan_shape(auto["plan"]) == plan_shape(best["plan"])
                checks.append({"target": f"{model} {protocol}: auto's rate >= the best fixed plan's",
                               "measured": f"auto {auto['best_rate'] or 0:.1f}/s, best fixed {best['config']} "
                                           f"{best['best_rate']:.1f}/s" + (" (auto chose that plan)" if same else ""),
                               "held": same or (auto["best_rate"] or 0) >= best["best_rate"]})
        for config in dict.fromkeys(r["config"] for r in mine):
            by = {r["protocol"]: r for r in mine if r["config"] == config}
            if set(PROTOCOLS) <= set(by):
                http, grpc = by["http"]["sat_tensor_per_s"], by["grpc"]["sat_tensor_per_s"]
                checks.append({"target": f"{model} {config}: gRPC saturation >= {GRPC_VS_HTTP:g}x HTTP's",
                               "measured": f"gRPC {grpc:.1f}/s, HTTP {http:.1f}/s ({grpc / http:.2f}x)",
                               "held": grpc >= GRPC_VS_HTTP * http})
    return checks + [check for c in comparisons for check in side_by_side_targets(c)]


def side_by_side_targets(comparison: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets of one side-by-side comparison (one body): auto against the peer, against itself
    unbatched, and against its own start-up prediction, each where the servers ran."""
    servers = comparison["servers"]
    if ours_name("auto") not in servers:
        return []
    checks = [peer_target(comparison)] if comparison["peer"] in servers else []
    if ours_name("max-batch-1") in servers:
        checks.append(batching_target(comparison))
    if servers[ours_name("auto")]["served_as"].get("predicted"):
        checks.append(prediction_target(comparison))
    return checks


def ratio_target(comparison: dict[str, Any], theirs_name: str, factor: float, what: str) -> dict[str, Any]:
    """auto's SLO rate against `theirs_name`'s, repetition by repetition, at least `factor` every time."""
    ours, theirs = ([rate_held(s) for s in comparison["servers"][name]["sweeps"]]
                    for name in (ours_name("auto"), theirs_name))
    # Ours holding none: 0. Theirs holding none: its lowest rate tried bounds it, the ratio is at least this.
    pairs = [((a if a_ok else 0.0), b, b_ok) for (a, a_ok), (b, b_ok) in zip(ours, theirs)]
    ratios = [a / b for a, b, _ in pairs]
    measured = ", ".join(f"{a:.1f}/s vs {rate_text(b, b_ok)}/s ({'' if b_ok else '>'}{r:.2f}x)"
                         for (a, b, b_ok), r in zip(pairs, ratios))
    return {"target": f"{comparison['model']}, {BODY_WORDS[comparison.get('body', 'json')]}: inceptionlab's SLO "
                      f"rate >= {factor:g}x {what}, every repetition",
            "measured": measured, "held": bool(ratios) and min(ratios) >= factor,
            "applies": comparison["model"] == "demo"}


def peer_target(comparison: dict[str, Any]) -> dict[str, Any]:
    """`serve` as it plans itself (auto) against the peer, every repetition; fixed plans are rows only."""
    peer = comparison["peer"]
    body = comparison.get("body", "json")
    sent = f" ({PEER_BODIES[body]})" if PEER_BODIES[body] != body else ""
    return ratio_target(comparison, peer, PEER_TARGET, f"{peer}'s{sent}")


def batching_target(comparison: dict[str, Any]) -> dict[str, Any]:
    """auto against the same server with --max-batch 1: what batching buys, every repetition."""
    check = ratio_target(comparison, ours_name("max-batch-1"), BATCHING_TARGET, "with --max-batch 1")
    return {**check, "applies": check["applies"] and comparison.get("body") == "raw"}


def prediction_target(comparison: dict[str, Any]) -> dict[str, Any]:
    """The rate auto's start-up line predicts for its plan against the median of the rates measured."""
    record = comparison["servers"][ours_name("auto")]
    prediction = record["served_as"]["predicted"]
    rates = [rate for rate, _ in (rate_held(s) for s in record["sweeps"])]
    measured = statistics.median(rates) if rates else 0.0
    off = measured / prediction["rate"] - 1 if prediction["rate"] else math.inf
    return {"target": f"{comparison['model']}, {BODY_WORDS[comparison.get('body', 'json')]}: the start-up line's "
                      f"predicted rate within {PREDICTION_TOLERANCE:.0%} of the measured one",
            "measured": f"{prediction['plan']} predicted {prediction['rate']:.1f}/s, measured {measured:.1f}/s "
                        f"({off:+.0%})",
            "held": abs(off) <= PREDICTION_TOLERANCE,
            "applies": comparison["model"] == "demo" and comparison.get("body") == "raw"}


COLUMNS = [("model", "model"), ("config", "config"), ("protocol", "protocol"), ("plan", "instances x max batch, delay"),
           ("precision", "runtime"), ("low_p50_ms", "p50 ms at low load", ".1f"),
           ("low_p99_ms", "p99 ms at low load", ".1f"), ("best_rate", "highest rate holding the SLO, /s", ".1f"),
           ("rates", "each repetition, /s", ".1f"), ("predicted_rate", "start-up line's prediction, /s", ".1f"),
           ("rate_vs_unbatched", "vs 1x1", ".2f"), ("sat_tensor_per_s", "saturation, tensors/s", ".1f"),
           ("sat_batch", "avg batch", ".2f"), ("bench_img_per_s", "bench img/s, same batch", ".1f"),
           ("overhead_ratio", "server/bench", ".2f"), ("sat_image_per_s", "saturation, JPEG/s", ".1f"),
           ("decode_share", "decode share", ".0%"), ("client_cpu", "client CPU, cores", ".2f"),
           ("loadavg", "load average before, after", ".1f")]


def parse_args(cpus: int) -> argparse.Namespace:
    configs = all_configs(cpus)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="demo,inception_v3", help="comma list: demo (the demo run's Inception "
                        "v3 at 80 px) and pretrained model names (random weights)")
    parser.add_argument("--demo-run", type=Path, default=None, help="the demo's run directory (default: trained as "
                        "`make demo` trains it under --out; one epoch with a pinned --precision)")
    parser.add_argument("--backend", default="auto", help="as `serve --backend` (auto: OpenVINO on a CPU when "
                                                          "installed, else ONNX Runtime)")
    parser.add_argument("--precision", default="auto", help="as `serve --precision` (auto: bf16 only where the "
                                                            "CPU has bf16 units and it agrees with fp32)")
    parser.add_argument("--configs", default=",".join(c for c in configs if c != "max-batch-1"),
                        help=f"comma list of {', '.join(configs)} (the plans auto chooses from here, and auto)")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS), help="comma list of http, grpc")
    parser.add_argument("--peer", default="litserve", choices=PEERS, help="the peer server run beside auto on "
                                                                          "the same export (none: skip)")
    parser.add_argument("--peer-configs", default="auto,max-batch-1", help="comma list of our configurations "
                        "run beside the peer (auto: the targets'; max-batch-1: what batching is judged against; "
                        "fixed plans: rows)")
    parser.add_argument("--bodies", default=",".join(BODIES), help=f"comma list of {', '.join(BODIES)}: the "
                        "request bodies of the side-by-side runs (the peer gets multipart for raw)")
    parser.add_argument("--resolution", type=float, default=0.05, help="each sweep's bisection stops within this "
                        "share of the rate (0.05: two sweeps of one plan land within a step of each other)")
    parser.add_argument("--peer-max-batch", type=int, default=1, help="LitServe's max_batch_size (its default: 1)")
    parser.add_argument("--peer-batch-timeout-ms", type=float, default=0.0, help="LitServe's batch_timeout")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions of the side-by-side sweeps")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--slo-ms", type=float, default=None, help="p99 objective (default, per model: 5x the first "
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
    parser.add_argument("--server-src", type=Path, default=None, help="run the servers (not the peer, not this "
                        "client) from this checkout's src/: a before/after comparison with one client; auto then "
                        "plans for its own default objective")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-serve"))
    args = parser.parse_args()
    args.models = [n.strip() for n in args.models.split(",") if n.strip()]
    args.names = [n.strip() for n in args.configs.split(",") if n.strip()]
    args.protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    args.peer_configs = [n.strip() for n in args.peer_configs.split(",") if n.strip()]
    args.bodies = [b.strip() for b in args.bodies.split(",") if b.strip()]
    if [b for b in args.bodies if b not in BODIES]:
        parser.error(f"--bodies {','.join(args.bodies)}: take {', '.join(BODIES)}")
    unknown = [n for n in args.names + args.peer_configs if n not in configs] + \
        [p for p in args.protocols if p not in PROTOCOLS]
    if unknown:
        parser.error(f"{','.join(unknown)}: --configs and --peer-configs take {', '.join(configs)}; "
                     "--protocols http, grpc")
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: give at least 1")
    args.config_options = configs
    return args


def measure_target(target: Target, args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[int, float],
                                                                       list[dict[str, Any]], Plan]:
    """Every configuration of one model, its bench reference, and the side-by-side runs with the peer."""
    plan = Plan(args.low_rate, args.start_rate, args.slo_ms)
    results = [measure_config(target, name, args, plan, args.out) for name in args.names]
    comparisons: list[dict[str, Any]] = []
    if args.peer != "none":
        missing = peer_missing()
        if missing:
            log(f"[{target.name}] no peer row: {missing}")
        else:
            comparisons = measure_against_peer(target, args, plan, args.out)
    bench = bench_reference(target, args, results[0]["served_as"], [r["served_as"]["max_batch"] for r in results])
    return results, bench, comparisons, plan


def main() -> None:
    cpus = hardware.usable_cpus()
    args = parse_args(cpus)
    started = time.time()
    results, bench, comparisons, plans = [], {}, [], {}
    for target in targets_of(args):
        measured, bench[target.name], compared, plans[target.name] = measure_target(target, args)
        results += measured
        comparisons += compared
    rows = summarize(results, bench) + peer_rows(comparisons)
    checks = targets(rows, comparisons)
    slos = ", ".join(f"{name} p99 <= {plan.slo_ms:g} ms" for name, plan in plans.items())
    path = write_result("serve", rows, settings={k: str(v) for k, v in vars(args).items() if k != "config_options"},
                        columns=COLUMNS,
                        title=f"`inceptionlab serve`: {', '.join(args.models)}, payload {args.payload}, SLO {slos}, "
                              f"{cpus} CPUs",
                        details={"plans": {name: vars(plan) for name, plan in plans.items()},
                                 "seconds": round(time.time() - started), "targets": checks,
                                 "bench_img_per_s": bench, "results": results, "peer": comparisons})
    for name, plan in plans.items():
        print(f"{name}: low load {plan.low_rate}/s; sweeps from {plan.start_rate}/s (x1.5, then bisection to "
              f"{args.resolution:.0%}); "
              f"SLO p99 <= {plan.slo_ms:g} ms")
    print(render_file(path))
    for check in checks:
        print(f"{'held' if check['held'] else 'MISSED'}: {check['target']} ({check['measured']})")


if __name__ == "__main__":
    main()
