"""Saturation throughput of `inceptionlab serve` vs what `inceptionlab bench` measures for the same model.

1. `bench` (in-process, the library behind the command): the runtime alone, one batch size.
2. `serve` in a subprocess with the same backend/precision and --max-batch; a closed-loop client
   keeps `--concurrency` single-image requests in flight (preprocessed FP32 tensors, OIP binary
   extension) for `--seconds`, after a warm-up phase; images/s = answered images / seconds.
3. `bench` again (the server stopped): on a shared machine the load moves while this runs, so the
   server is compared with the mean of the runs before and after it.
4. Prints both and the ratio (target >= 0.85): what batching, HTTP, parsing and the event loop cost.

The client shares the machine with the server (2 cores here): its own CPU time counts against the
server, so the ratio is a lower bound of the server's own overhead.

    python benchmarks/serve_saturation.py --model inception_v3 --backend onnxruntime --batch 8 --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from _results import write_result  # this folder's sibling module

REPO = Path(__file__).resolve().parents[1]


def bench_img_per_s(args: argparse.Namespace) -> dict:
    from inceptionlab.infer.bench import BenchSettings, Config, run_bench
    from inceptionlab.infer.source import load_source
    from inceptionlab.infer.runtimes import NATIVE_LAYOUT

    # runs/exports under the workdir: where `serve` (run there) looks, so both use the same export
    source = load_source(model=args.model, weights=args.weights, out=Path(args.workdir) / "runs" / "exports")
    layout = "nchw" if args.backend in ("eager", "compile") else NATIVE_LAYOUT
    report = run_bench(source, [Config(args.backend, args.precision, layout)],
                       BenchSettings(batches=[args.batch], iters=args.iters, warmup=args.warmup), log=print)
    return report.rows[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(args: argparse.Namespace, port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "inceptionlab", "serve", "--model", args.model, "--weights", args.weights,
               "--backend", args.backend, "--precision", args.precision, "--device", "cpu",
               "--max-batch", str(args.batch), "--max-delay-ms", str(args.max_delay_ms),
               "--instances", str(args.instances), "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.Popen(command, cwd=args.workdir, env=env)


def wait_ready(base: str, process: subprocess.Popen, limit_s: float = 900) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited with {process.returncode}")
        try:
            if httpx.get(f"{base}/v2/health/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit("server not ready in time")


def request_body(shape: list[int]) -> tuple[bytes, dict[str, str]]:
    tensor = np.random.default_rng(0).standard_normal((1, *shape)).astype(np.float32)
    header = json.dumps({"inputs": [{"name": "images", "shape": [1, *shape], "datatype": "FP32",
                                     "parameters": {"binary_data_size": tensor.nbytes}}],
                         "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}]}).encode()
    return header + tensor.tobytes(), {"Inference-Header-Content-Length": str(len(header)),
                                       "Content-Type": "application/octet-stream"}


async def closed_loop(base: str, model: str, concurrency: int, seconds: float, warmup_s: float) -> dict:
    async with httpx.AsyncClient(base_url=base, timeout=120,
                                 limits=httpx.Limits(max_connections=concurrency)) as http:
        shape = (await http.get(f"/v2/models/{model}")).json()["inputs"][0]["shape"][1:]
        body, headers = request_body(shape)
        start = time.perf_counter()
        measure_from, stop_at = start + warmup_s, start + warmup_s + seconds
        done, errors, latencies = 0, 0, []

        async def client() -> None:
            nonlocal done, errors
            while time.perf_counter() < stop_at:
                sent = time.perf_counter()
                response = await http.post(f"/v2/models/{model}/infer", content=body, headers=headers)
                finished = time.perf_counter()
                # Completions inside the window, whenever sent: a closed loop's throughput (requesting
                # "sent inside" too would drop ~latency/window of them: 8 s of 30 s under load here).
                if measure_from <= finished <= stop_at:
                    if response.status_code == 200:
                        done += 1
                        latencies.append(finished - sent)
                    else:
                        errors += 1

        await asyncio.gather(*(client() for _ in range(concurrency)))
        metrics = (await http.get("/metrics")).text
    executions = sum(float(line.split()[-1]) for line in metrics.splitlines()
                     if line.startswith("inceptionlab_executions_total"))
    inferences = sum(float(line.split()[-1]) for line in metrics.splitlines()
                     if line.startswith("inceptionlab_inferences_total"))
    return {"img_per_s": done / seconds, "answered": done, "errors": errors,
            "p50_ms": float(np.percentile(latencies, 50) * 1e3) if latencies else None,
            "p99_ms": float(np.percentile(latencies, 99) * 1e3) if latencies else None,
            "avg_batch": inferences / max(executions, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="inception_v3")
    parser.add_argument("--weights", default="random")
    parser.add_argument("--backend", default="onnxruntime")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--batch", type=int, default=8, help="bench batch size = serve --max-batch")
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--max-delay-ms", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=0, help="requests in flight (default: 2 x batch)")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--workdir", default="runs/serve-saturation")
    parser.add_argument("--skip-bench", action="store_true")
    args = parser.parse_args()
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    args.workdir = str(Path(args.workdir).resolve())
    concurrency = args.concurrency or 2 * args.batch
    row = None if args.skip_bench else bench_img_per_s(args)
    port = free_port()
    process = start_server(args, port)
    try:
        wait_ready(f"http://127.0.0.1:{port}", process)
        served = asyncio.run(closed_loop(f"http://127.0.0.1:{port}", args.model, concurrency, args.seconds,
                                         args.warmup_s))
    finally:
        process.terminate()
        process.wait(timeout=120)
    after = None if args.skip_bench else bench_img_per_s(args)
    bench = [r["img_per_s"] for r in (row, after) if r]
    result = {"model": args.model, "backend": args.backend, "precision": args.precision, "batch": args.batch,
              "instances": args.instances, "concurrency": concurrency, "bench_img_per_s_before_after": bench,
              "bench_provider": row["provider"] if row else None, "serve": served, "loadavg": os.getloadavg()}
    if bench:
        result["ratio"] = round(served["img_per_s"] / (sum(bench) / len(bench)), 3)
    print(json.dumps(result, indent=2))
    write_result("serve_saturation", [{**result, **{f"serve_{k}": v for k, v in served.items()}}],
                 settings={k: str(v) for k, v in vars(args).items()},
                 title=f"`inceptionlab serve` at saturation against `bench`: {args.model}, {args.backend} "
                       f"{args.precision}, --max-batch {args.batch}, {concurrency} closed-loop clients",
                 columns=[("serve_img_per_s", "served img/s", ".2f"), ("serve_avg_batch", "avg batch", ".2f"),
                          ("bench_img_per_s_before_after", "bench img/s before, after"),
                          ("ratio", "served / bench", ".2f"), ("serve_p50_ms", "p50 ms", ".1f"),
                          ("serve_p99_ms", "p99 ms", ".1f")])


if __name__ == "__main__":
    main()
