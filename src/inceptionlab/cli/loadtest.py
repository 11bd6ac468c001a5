"""`inceptionlab loadtest`: offer load to an Open Inference Protocol server (ours, Triton, KServe)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import List, Optional

import typer

from inceptionlab.errors import UserError
from inceptionlab.fileio import append_jsonl


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def loadtest(
    url: str = typer.Argument(..., help="The server: its base URL over HTTP, e.g. http://127.0.0.1:8000; its "
                                        "HOST:PORT over gRPC, e.g. 127.0.0.1:8001 (Triton's ports too)."),
    protocol: str = typer.Option("http", "--protocol", help="http: the binary tensor extension over HTTP/1.1; "
                                                            "grpc: ModelInfer with raw_input_contents."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name (default: the only model the "
                                                              "server's repository index lists)."),
    images: List[Path] = typer.Option([], "--images", help="Images/folders to send (default: the sample "
                                                           "pictures, else generated JPEGs)."),
    payload: str = typer.Option("image", "--payload", help="image: encoded files as a BYTES tensor; tensor: "
                                                            "UINT8 pixels of the model's input shape; fp32: "
                                                            "float pixels (Triton serving the ONNX export)."),
    rate: Optional[float] = typer.Option(None, "--rate", help="Open loop: Poisson arrivals, requests/s "
                                                              "(--sweep: the first rate)."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", help="Closed loop: this many clients."),
    duration: float = typer.Option(10.0, "--duration", help="Seconds of load per measurement."),
    min_requests: int = typer.Option(0, "--min-requests", min=0, help="Open loop: run at least long enough "
                                                                      "to send this many (p99 needs ~100)."),
    sweep: bool = typer.Option(False, "--sweep", help="Raise the rate (x1.6) until p99 > --slo-ms, then "
                                                      "bisect; report the highest rate that held it."),
    slo_ms: float = typer.Option(100.0, "--slo-ms", help="p99 latency objective, ms."),
    max_error_rate: float = typer.Option(0.01, "--max-error-rate", help="Failures (503, errors, timeouts) a "
                                                                        "rate may have and still hold the SLO."),
    max_steps: int = typer.Option(12, "--max-steps", min=1, help="--sweep: at most this many measurements."),
    timeout: float = typer.Option(30.0, "--timeout", help="Seconds per request, end to end."),
    connections: int = typer.Option(64, "--connections", min=1, help="HTTP connection pool size (gRPC: one "
                                                                      "HTTP/2 channel)."),
    warmup: int = typer.Option(4, "--warmup", min=0, help="Untimed requests first."),
    seed: int = typer.Option(0, "--seed", help="Seed of the Poisson schedule."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Bearer key for a server started with "
                                                                  "--api-key (default: $INCEPTIONLAB_API_KEY)."),
    out: Path = typer.Option(Path("runs/loadtest"), "--out", help="Rows go to OUT/results.jsonl, the plot "
                                                                  "to OUT/plots/loadtest.png."),
    plot: bool = typer.Option(True, "--plot/--no-plot", help="Draw latency against offered rate."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per measurement on stdout."),
) -> None:
    """Measure latency under load. Open loop (--rate): Poisson arrivals, latency counted from each
    request's scheduled send time, so a server that stalls cannot hide its slow period. Closed loop
    (--concurrency): C clients back to back, over HTTP or gRPC (--protocol). Reports offered vs
    achieved rate, p50/p90/p99/p99.9 of successful requests, rejections (503, RESOURCE_EXHAUSTED) and
    other errors apart, from the server's /metrics (gRPC: its statistics) its average batch size and
    queue/compute time per request, and the generator's own CPU use, with a warning when the
    generator itself may be the bottleneck.

    Examples:

      inceptionlab loadtest http://127.0.0.1:8000 --model inception_v3 --rate 20 --duration 20

      inceptionlab loadtest http://127.0.0.1:8000 --model inception_v3 --sweep --slo-ms 100

      inceptionlab loadtest 127.0.0.1:8001 --protocol grpc --model inception_v3 --rate 20 --duration 20

      inceptionlab loadtest http://triton:8000 --model inception_v3 --payload fp32 --concurrency 8 --json
    """
    try:  # the loadtest extra: checked before the generator, which imports these at its top
        import aiohttp  # noqa: F401
        import prometheus_client  # noqa: F401

        if protocol == "grpc":
            import grpc  # noqa: F401
    except ImportError:
        raise UserError("the load generator needs aiohttp, prometheus-client and (for gRPC) grpcio: pip install "
                        "'inceptionlab[loadtest]'") from None
    # the loadtest extra (aiohttp) and matplotlib (~0.4 s): only when the command runs, never for --help
    from inceptionlab.loadtest.generator import LoadSettings, run_load, run_sweep, settings_dict
    from inceptionlab.loadtest.report import (client_environment, client_warning_lines, format_table, plot_latency_vs_rate,
                                              records, redacted)

    settings = LoadSettings(url.rstrip("/"), model=model, rate=rate, concurrency=concurrency, duration=duration,
                            min_requests=min_requests, payload=payload, images=list(images), slo_ms=slo_ms,
                            max_error_rate=max_error_rate, timeout=timeout, connections=connections, warmup=warmup,
                            seed=seed, api_key=api_key or os.environ.get("INCEPTIONLAB_API_KEY") or None,
                            protocol=protocol)
    settings.check()
    if not sweep and rate is None and concurrency is None:
        raise UserError("give --rate R (open loop), --concurrency C (closed loop) or --sweep")

    def emit(row: dict) -> None:
        if as_json:
            print(json.dumps(row, default=str), flush=True)
        else:
            _log(_progress(row))

    if sweep:
        result = run_sweep(settings, max_steps=max_steps, on_row=emit)
        rows = result["rows"]
    else:
        result = None
        rows = [run_load(settings)]
        emit(rows[0])
    argv = redacted(sys.argv[2:] if sys.argv[1:2] == ["loadtest"] else sys.argv[1:])
    command = "inceptionlab loadtest " + shlex.join(argv)
    env = client_environment()
    append_jsonl(out / "results.jsonl", records(rows, settings.url, command, settings_dict(settings), env))
    if not as_json:
        load = "-" if env["load_average"] is None else f"{env['load_average']:.2f}"
        print(f"{rows[0]['model']} at {settings.url} over {protocol}, payload {payload}, {duration:g} s per "
              f"measurement; client: {env['cpu']}, load average {load}")
        print(format_table(rows))
        for line in client_warning_lines(rows):
            print(line)
        if result is not None:
            print(_sweep_line(result, slo_ms))
    else:
        if result is not None:
            print(json.dumps({"sweep": {k: v for k, v in result.items() if k != "rows"}}, default=str))
        for line in client_warning_lines(rows):
            _log(line)
    _log(f"results appended to {out / 'results.jsonl'}")
    if plot:
        path = plot_latency_vs_rate(rows, out / "plots" / "loadtest.png", f"{rows[0]['model']} at {settings.url}")
        if path:
            _log(f"plot {path}")


def _progress(row: dict) -> str:
    load = f"rate {row['rate']:.3g}/s" if row["mode"] == "open" else f"concurrency {row['concurrency']}"
    p99 = "-" if row["p99_ms"] is None else f"{row['p99_ms']:.1f} ms"
    return (f"{load}: achieved {row['achieved_rate']:.2f}/s, p99 {p99}, rejected {row['rejected']}, "
            f"errors {row['error'] + row['timeout']}, client CPU {row['client_cpu']:.0%} -> "
            f"{'held' if row['slo_met'] else 'missed'} the SLO")


def _sweep_line(result: dict, slo_ms: float) -> str:
    if result["best"] is None:
        return f"no rate held p99 <= {slo_ms:g} ms"
    best = result["best"]
    note = "" if result["complete"] else " (stopped at --max-steps before the bisection converged)"
    return (f"highest rate holding p99 <= {slo_ms:g} ms: Poisson rate {best['rate']:.3g}/s ({best['offered_rate']:.3g}/s "
            f"offered in this sample, {best['achieved_rate']:.3g}/s achieved), p99 {best['p99_ms']:.1f} ms{note}")


def register(root: typer.Typer) -> None:
    root.command("loadtest")(loadtest)
