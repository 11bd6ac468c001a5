"""torch.compile for serving: the batch dimension dynamic (one graph for batch 1, one for every larger
batch) against one static graph per batch size, on one model, device and precision.

What `hardware.compile_dynamic_batch` decides per device kind. Reported per mode: the compile seconds
of all the buckets together (cold: a fresh Inductor cache folder and a reset dynamo per mode), the
number of graphs compiled, and each bucket's median latency, the two modes alternated over `--rounds`
rounds (a shared machine drifts; alternating keeps the drift out of the comparison).

    python benchmarks/compile_batch.py [--model inception_v3] [--size 299] [--buckets 1,2,4,8,16,32]
        [--device cpu|cuda] [--precision fp32] [--iters 10] [--rounds 3] [--json]

Smoke run: --model cifar10_cnn --size 32 --buckets 1,2,4 --iters 3 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from inceptionlab.infer.runtimes import TorchSession
from inceptionlab.models.registry import build_model

MODES = {"dynamic": True, "static": False}


def compile_mode(model: torch.nn.Module, dynamic: bool, args: argparse.Namespace, cache: Path,
                 buckets: list[int]) -> tuple[TorchSession, dict[str, Any]]:
    """A compiled session of `model` and its cold compile over every bucket: seconds and graphs."""
    torch._dynamo.reset()
    session = TorchSession(model, args.precision, "nchw", args.device, buckets[-1], compile_cache=cache,
                           dynamic_batch=dynamic)
    started = time.perf_counter()
    for batch in buckets:
        session.run(session.place(np.zeros((batch, 3, args.size, args.size), np.float32)))
    return session, {"compile_s": round(time.perf_counter() - started, 2), "graphs": session.compiled.graphs,
                     "provider": session.provider}


def median_ms(session: TorchSession, batch: int, size: int, iters: int) -> float:
    placed = session.place(np.random.default_rng(0).standard_normal((batch, 3, size, size), dtype=np.float32))
    times = []
    for _ in range(iters):
        began = time.perf_counter()
        session.run(placed)
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="inception_v3")
    parser.add_argument("--size", type=int, default=299)
    parser.add_argument("--buckets", default="1,2,4,8,16,32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    buckets = [int(b) for b in args.buckets.split(",")]
    torch.manual_seed(0)
    model = build_model(args.model, 1000 if args.model == "inception_v3" else 10, None, None).model.eval()
    sessions, result = {}, {"args": vars(args), "modes": {}}
    with tempfile.TemporaryDirectory() as folder:
        for name, dynamic in MODES.items():
            sessions[name], result["modes"][name] = compile_mode(model, dynamic, args, Path(folder) / name, buckets)
        latency: dict[str, dict[int, list[float]]] = {name: {b: [] for b in buckets} for name in MODES}
        for round_ in range(args.rounds):
            order = list(MODES) if round_ % 2 == 0 else list(reversed(MODES))
            for batch in buckets:
                for name in order:
                    latency[name][batch].append(median_ms(sessions[name], batch, args.size, args.iters))
    for name in MODES:
        result["modes"][name]["p50_ms"] = {b: round(statistics.median(v), 3) for b, v in latency[name].items()}
    result["static_over_dynamic"] = {b: round(result["modes"]["static"]["p50_ms"][b] / result["modes"]["dynamic"]
                                              ["p50_ms"][b], 3) for b in buckets}
    if args.json:
        print(json.dumps(result))
        return
    for name in MODES:
        mode = result["modes"][name]
        print(f"{name:8} compile {mode['compile_s']:7.1f} s, {mode['graphs']} graph(s); p50 ms per batch: "
              + ", ".join(f"{b}: {ms:.2f}" for b, ms in mode["p50_ms"].items()))
    print("static / dynamic latency: " + ", ".join(f"{b}: {r:.2f}" for b, r in result["static_over_dynamic"].items()))


if __name__ == "__main__":
    main()
