"""The server's own CPU per request, and where it goes: `inceptionlab serve` variants A/B'd in one run.

    python benchmarks/serve_cpu.py --run RUN_DIR                         # uvicorn[standard] vs plain, HTTP
    python benchmarks/serve_cpu.py --run RUN_DIR --variants standard --profile runs/serve-cpu
    python benchmarks/serve_cpu.py --model inception_v3 --protocol grpc --payload tensor --rate 10
    python benchmarks/serve_cpu.py --model inception_v3 --variants baseline,standard --baseline-src ../base/src \
        --serve-args "--instances 1 --max-batch 1" --rate 5,7 --duration 20   # before/after, one client

Each variant is its own `inceptionlab serve` process on 127.0.0.1, all started before the first
measurement and all alive until the last, and the same open-loop Poisson load (the loadtest library,
this process) goes to each in turn, round after round (A B A B ...): a figure taken while another
program used the machine meets its twin in the next round. Per measurement: the server process's CPU
time (user + system, every thread, from /proc) over the requests it answered, in ms per request, and
the client's latency percentiles. CPU time per request moves much less than latency when the machine
is shared, but neither is a result unless the machine was quiet (the load average is in every row).
Each row also splits that CPU time by thread (`threads_ms_per_request`, from /proc/PID/task): the
server names its pools' threads (`preprocess`: parsing, decoding, preprocessing; `infer-NAME`: each
instance's batches, with the runtime's work on that thread), the main thread runs the event loop, and a
runtime's own worker threads carry the name of the thread that made them (OpenVINO's: `openvino`, the
thread that compiled the model). Unlike sampling, it counts every CPU tick.

Variants (the event loop and HTTP parser uvicorn runs on, and the collector policy):
  standard  uvloop + httptools (uvicorn's `auto` when `uvicorn[standard]` is installed), what serve runs on
  plain     asyncio's own loop + h11 (uvicorn without its standard extras)
  nofreeze  standard, without freezing start-up's objects out of the garbage collector's reach
  young10k  standard, with the youngest generation collected every 10,000 allocations instead of 700
  onethread standard, each instance's runtime on one thread instead of its share of the CPUs
  baseline  `inceptionlab serve` from another checkout's src/ (--baseline-src), as it is: before/after

`--body json` sends the plain JSON form (base64 images, what benchmarks/serve.py sends both servers)
instead of the binary tensor extension.

`--profile DIR` attaches py-spy to each server for its first measurement (--profile-rate samples/s, idle
threads left out; on a busy 2-core machine py-spy falls behind at 200/s) and prints where
its CPU went, by part: HTTP (uvicorn, starlette, FastAPI), decoding and preprocessing (PIL,
torchvision), inference (the runtime), batching, metrics, request parsing, response encoding, gRPC, and
"event loop, waits": uvloop's run loop and the thread pools' idle workers. py-spy does not see a thread
blocked inside uvloop's C loop (epoll) or a pool's queue as idle, so that share is mostly waiting: on the
demo at 25 requests/s (AMD EPYC Zen 3) 60 of its 69 samples were `Runner.run` and an idle pool worker.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from _results import render_file, write_result  # this folder's sibling modules
from _servers import checkout_env, free_port, stop_gracefully, wait_until_ready
from inceptionlab.loadtest.generator import LoadSettings, run_load
from inceptionlab.loadtest.payloads import BODIES

VARIANTS = {"standard": {"loop": "auto", "http": "auto", "freeze": True},
            "plain": {"loop": "asyncio", "http": "h11", "freeze": True},
            "nofreeze": {"loop": "auto", "http": "auto", "freeze": False},
            "young10k": {"loop": "auto", "http": "auto", "freeze": True, "threshold": (10_000, 10, 10)},
            "onethread": {"loop": "auto", "http": "auto", "freeze": True, "threads": 1}}
TICKS = os.sysconf("SC_CLK_TCK")
# Where a sample's CPU went: the first part whose pattern matches a frame (function and file, as py-spy
# prints them), from the leaf up.
PARTS = [("inference", r"infer/runtimes|openvino|onnxruntime|torch/nn/"),
         ("decode", r"PIL/|data/io/decode"), ("preprocessing", r"torchvision|models/spec|preprocess_image|normali"),
         ("metrics", r"prometheus_client|serve/metrics|serve/live"),
         ("request parsing", r"parse_infer_request|serve/protocol|multipart|decode_request|formparsers"),
         ("response encoding", r"encode_|json/|jsonable_encoder|responses\.py"), ("gRPC", r"grpc"),
         ("batching", r"serve/batcher"), ("HTTP", r"uvicorn|starlette|fastapi|httptools|h11|anyio"),
         ("event loop, waits", r"asyncio|uvloop|selectors|concurrent/futures|threading")]


COLUMNS = [("variant", "variant"), ("round", "round"), ("rate", "Poisson rate, /s", "g"),
           ("server_cpu_ms_per_request", "server CPU, ms per request", ".2f"),
           ("p50_ms", "p50 ms", ".1f"), ("p99_ms", "p99 ms", ".1f"), ("ok", "answered"), ("errors", "failed"),
           ("client_cpu", "client CPU, cores", ".2f"), ("loadavg_1min", "load average", ".1f")]


def run_as_server(variant: str, argv: list[str]) -> None:
    """This file as the server process: `inceptionlab serve` with the variant's loop, parser and collector."""
    from inceptionlab.cli.app import main
    from inceptionlab.serve import server

    chosen = VARIANTS[variant]
    config, settle = server.uvicorn_config, server.settle_collector
    server.uvicorn_config = lambda *args, **kwargs: _with(config(*args, **kwargs), chosen)
    if "threads" in chosen:
        from inceptionlab import hardware
        from inceptionlab.hardware import serving
        hardware.instance_threads = serving.instance_threads = lambda cpus, instances: chosen["threads"]
    if not chosen["freeze"]:
        server.settle_collector = lambda: None
    elif "threshold" in chosen:
        server.settle_collector = lambda: (settle(), gc.set_threshold(*chosen["threshold"]))
    main(argv)


def _with(config: Any, chosen: dict[str, Any]) -> Any:
    config.loop, config.http = chosen["loop"], chosen["http"]
    return config


class Server:
    def __init__(self, variant: str, serve_args: list[str], log: Path, baseline_src: Path | None = None):
        self.variant, self.port, self.grpc_port = variant, free_port(), free_port()
        ports = ["--port", str(self.port), "--grpc-port", str(self.grpc_port)]
        command = [sys.executable, __file__, "--as-server", variant, "serve", *serve_args, *ports]
        env = None
        if variant == "baseline":  # the other checkout's server untouched (it may predate the patched hooks)
            command = [sys.executable, "-m", "inceptionlab", "serve", *serve_args, *ports]
            env = checkout_env(baseline_src)
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(log, "w")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.pid: int | None = None

    def url(self, protocol: str) -> str:
        return f"http://127.0.0.1:{self.port}" if protocol == "http" else f"127.0.0.1:{self.grpc_port}"

    def wait_ready(self) -> None:
        wait_until_ready(f"{self.url('http')}/v2/health/ready", self.process, Path(self.log.name), what=self.variant)
        self.pid = self.process.pid

    def profiler(self, path: Path, seconds: float, rate: int) -> subprocess.Popen:
        """py-spy attached to the server for `seconds` (the measurement's window, not start-up), raw stacks to
        `path`; it samples without stopping the server."""
        spy = Path(sys.executable).with_name("py-spy")  # installed beside this Python, else on PATH
        return subprocess.Popen([str(spy) if spy.exists() else "py-spy", "record", "--pid", str(self.pid),
                                 "--duration", str(max(1, round(seconds))), "--rate", str(rate), "--format", "raw",
                                 "--nonblocking", "-o", str(path)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

    def cpu_seconds(self) -> float:
        return stat_cpu_seconds(Path(f"/proc/{self.pid}/stat").read_text())  # every thread's, ended ones too

    def stop(self) -> None:
        stop_gracefully(self.process, timeout_s=120)
        self.log.close()


def measure(server: Server, args: argparse.Namespace, rate: float, seed: int,
            profile: Path | None = None) -> dict[str, Any]:
    settings = LoadSettings(server.url(args.protocol), model=args.name, rate=rate, duration=args.duration,
                            payload=args.payload, body=args.body, protocol=args.protocol, warmup=0, seed=seed,
                            slo_ms=1e9)
    spy = server.profiler(profile, args.duration, args.profile_rate) if profile is not None else None
    before, threads_before = server.cpu_seconds(), thread_cpu_seconds(server.pid)
    row = run_load(settings)
    spent, threads_after = server.cpu_seconds() - before, thread_cpu_seconds(server.pid)
    if spy is not None:
        spy.wait(timeout=120)
    return {"variant": server.variant, "rate": rate, "ok": row["ok"],
            "errors": row["error"] + row["rejected"] + row["timeout"],
            "server_cpu_ms_per_request": round(1e3 * spent / max(1, row["ok"]), 3),
            "p50_ms": row["p50_ms"], "p99_ms": row["p99_ms"], "client_cpu": row["client_cpu"],
            "loadavg_1min": row["loadavg_1min"],
            "threads_ms_per_request": thread_groups(server.pid, threads_before, threads_after, row["ok"])}


def thread_cpu_seconds(pid: int) -> dict[int, tuple[str, float]]:
    """Each live thread of process `pid`: (OS name, CPU seconds). The server names its pools' threads
    (host.name_os_thread); a runtime's own threads keep the name of the thread that made them."""
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name, stat = (task / "comm").read_text().strip(), (task / "stat").read_text()
        except OSError:  # a thread that ended meanwhile
            continue
        threads[int(task.name)] = (name, stat_cpu_seconds(stat))
    return threads


def stat_cpu_seconds(stat: str) -> float:
    """utime + stime of a /proc/.../stat line, in seconds (the fields after the command's closing paren)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def thread_groups(pid: int | None, before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                  requests: int) -> dict[str, float]:
    """CPU ms per request by thread, a pool's threads together (`preprocess_0`, `preprocess_1` ->
    `preprocess`); the main thread runs the event loop. Threads that ended in the window are left out."""
    groups: collections.Counter[str] = collections.Counter()
    for tid, (name, seconds) in after.items():
        group = "main (event loop)" if tid == pid else re.sub(r"_\d+$", "", name)
        groups[group] += seconds - before.get(tid, (name, 0.0))[1]
    return {group: round(1e3 * seconds / max(1, requests), 2) for group, seconds in groups.most_common() if seconds > 0}


def profile_parts(path: Path) -> dict[str, float]:
    """Shares of the samples in a py-spy raw file (collapsed stacks), by PARTS."""
    counts: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, number = line.rpartition(" ")
        if not stack or not number.isdigit():
            continue
        frames = stack.split(";")[::-1]
        part = next((name for frame in frames for name, pattern in PARTS if re.search(pattern, frame)), "other")
        counts[part] += int(number)
    total = sum(counts.values()) or 1
    return {part: round(count / total, 3) for part, count in counts.most_common()}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--as-server":
        return run_as_server(sys.argv[2], sys.argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a run directory (the demo's is the small per-image cost)")
    parser.add_argument("--model", help="a pretrained model instead, e.g. inception_v3 (random weights)")
    parser.add_argument("--serve-args", default="", help="more `serve` options, e.g. '--instances 1 --max-batch 32'")
    parser.add_argument("--variants", default="standard,plain", help=f"comma list of {', '.join(VARIANTS)}")
    parser.add_argument("--protocol", default="http", choices=["http", "grpc"])
    parser.add_argument("--payload", default="image", help="image (encoded files), tensor (UINT8) or fp32")
    parser.add_argument("--body", default="binary", choices=list(BODIES),
                        help="binary: the tensor extension (raw bytes); json: the plain JSON form (base64); raw: "
                             "the image file as the body, multipart: a form with it (both to /v1/classify)")
    parser.add_argument("--rate", default="80", help="Poisson requests/s (below saturation); a comma list: each")
    parser.add_argument("--baseline-src", type=Path, default=None, help="the `baseline` variant's checkout src/")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", type=Path, default=None, help="run the servers under py-spy; raw files here")
    parser.add_argument("--profile-rate", type=int, default=50, help="py-spy's samples per second")
    parser.add_argument("--out", type=Path, default=Path("runs/serve-cpu"))
    args = parser.parse_args()
    if (args.run is None) == (args.model is None):
        parser.error("give --run RUN_DIR or --model NAME")
    args.rates = [float(rate) for rate in args.rate.split(",")]
    if "baseline" in args.variants.split(",") and args.baseline_src is None:
        parser.error("the baseline variant runs another checkout's server: give --baseline-src OTHER/src")
    args.name = "model"
    source = [f"{args.name}={args.run}"] if args.run else ["--model", args.model, "--weights", "random"]
    if args.model:
        args.name = args.model
    serve_args = [*source, *args.serve_args.split()]
    servers = [Server(v, serve_args, args.out / f"server-{v}.log", args.baseline_src)
               for v in args.variants.split(",")]
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for server in servers:
            server.wait_ready()
        for round_ in range(args.rounds):
            for rate in args.rates:
                for server in servers:
                    first = round_ == 0 and rate == args.rates[0]
                    profile = args.profile / f"{server.variant}.txt" if args.profile is not None and first else None
                    rows.append({**measure(server, args, rate, seed=round_, profile=profile), "round": round_})
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        for server in servers:
            server.stop()
    profiles = {server.variant: profile_parts(args.profile / f"{server.variant}.txt") for server in servers
                if args.profile is not None and (args.profile / f"{server.variant}.txt").exists()}
    path = write_result("serve_cpu", rows, columns=COLUMNS,
                        settings={k: str(v) for k, v in vars(args).items()},
                        title=f"`inceptionlab serve` CPU per request: {args.run or args.model}, {args.protocol}, "
                              f"{args.payload} payload, Poisson {args.rate}/s, {args.rounds} rounds A/B",
                        details={"profiles": profiles})
    print(render_file(path))
    for row in rows:
        print(f"{row['variant']} at {row['rate']:g}/s, round {row['round']}, CPU ms per request by thread: "
              + ", ".join(f"{k} {v:.2f}" for k, v in row["threads_ms_per_request"].items()))
    for variant, parts in profiles.items():
        print(f"{variant}, where the server's CPU went: " + ", ".join(f"{k} {v:.0%}" for k, v in parts.items()))


if __name__ == "__main__":
    main()
