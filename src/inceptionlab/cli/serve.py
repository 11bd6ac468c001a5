"""`inceptionlab serve`: an Open Inference Protocol (KServe v2) server, HTTP and gRPC, for runs and pretrained models."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any, List, Optional

import typer

from inceptionlab.cli import options
from inceptionlab.errors import UserError
from inceptionlab.fileio import atomic_write_json
from inceptionlab.host import port_in_use


def serve(
    runs: List[Path] = typer.Argument(None, help="Run directories to serve (image or text models); "
                                      "NAME=RUN_DIR names one."),
    run: List[Path] = typer.Option([], "--run", help="A run directory made by `inceptionlab train` (same as "
                                   "RUN_DIR; repeatable)."),
    model: List[str] = typer.Option([], "--model", help="A torchvision model to serve, e.g. inception_v3 "
                                    "(repeatable)."),
    weights: Optional[str] = options.weights_option(),
    backend: str = typer.Option("auto", "--backend", help="auto | openvino | onnxruntime | compile | eager "
                                "(auto: OpenVINO on a CPU when installed, else ONNX Runtime, else eager)."),
    precision: str = typer.Option("auto", "--precision", help="auto | fp32 | bf16 | fp16 | int8 (reduced "
                                  "precisions only when they pass the agreement rule)."),
    device: str = options.device_option(),
    max_batch: str = typer.Option("auto", "--max-batch", help="Largest batch the dynamic batcher forms, and "
                                  "the most images one request may hold; auto: decided with --instances at "
                                  "start-up: each plan's batch times are measured (cached per machine) and the "
                                  "plan that holds the highest rate of random arrivals within --slo-ms is "
                                  "chosen, while a request may hold up to 32 images whatever the plan."),
    slo_ms: float = typer.Option(100.0, "--slo-ms", min=0.001, help="The latency objective auto plans are "
                                 "chosen for: p99 in ms under Poisson arrivals (the plans' rates and saturation "
                                 "are printed at start-up). A model slower than it even alone is planned for 5x "
                                 "its fastest lone request instead."),
    max_delay_ms: str = typer.Option("auto", "--max-delay-ms", help="Longest a request waits for its batch to "
                                     "fill, ms. Under a light load a request runs at once; as the rate grows, a "
                                     "free instance waits for the batch the measured batch times say keeps the "
                                     "cores from overloading. auto: 10% of --slo-ms or no wait, whichever the "
                                     "plan's simulation holds the higher rate with; 0 unbatched. Set together with "
                                     "--max-batch and --instances: Triton's rule, wait up to it for a full batch."),
    max_queue: int = typer.Option(256, "--max-queue", min=1, help="Queued requests per model; one more gets "
                                  "503 + Retry-After."),
    instances: str = typer.Option("auto", "--instances", help="Batches in flight per model (one session and "
                                  "worker thread each, each with its share of the CPUs); auto: measured with "
                                  "--max-batch (1, 2, 4 up to the CPUs this process may use; 1 on a GPU)."),
    calibrate: bool = typer.Option(False, "--calibrate", help="Measure the auto settings afresh instead of "
                                   "reusing this machine's speed cache."),
    timeout_s: float = typer.Option(30.0, "--timeout-s", min=0.001, help="Per-request timeout (504)."),
    drain_s: float = typer.Option(30.0, "--drain-s", min=0, help="On SIGTERM: longest wait for accepted "
                                  "requests."),
    max_body_mb: float = typer.Option(20.0, "--max-body-mb", min=0.001, help="Request body limit (413)."),
    max_concurrency: int = typer.Option(128, "--max-concurrency", min=1, help="Requests in progress at once "
                                        "per front end (HTTP requests, gRPC calls); one more gets 503 + "
                                        "Retry-After (gRPC: RESOURCE_EXHAUSTED) before its body is read. Bounds "
                                        "memory: at most this many x --max-body-mb of bodies."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Require this key (401 without it); default: "
                                          "$INCEPTIONLAB_API_KEY if set."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind (0.0.0.0 exposes it to the "
                             "network: set an API key)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="HTTP port."),
    tta: Optional[str] = options.tta_option(),
    explain: bool = typer.Option(False, "--explain", help="Also answer POST /v1/explain?model=NAME with a "
                                 "Grad-CAM overlay (PNG) of the posted image; each runs the eager model forward "
                                 "and backward (several inferences' cost), so it is off by default."),
    grpc_port: str = typer.Option("8001", "--grpc-port", help="gRPC port on --host (the protocol's "
                                  "GRPCInferenceService and the grpc.health.v1 service), or off. On by default "
                                  "at 8001, Triton's gRPC port, where Triton's clients and perf_analyzer -i grpc "
                                  "look for it: gRPC carries tensors as raw bytes with no JSON to parse, and "
                                  "costs nothing until a client connects. off: HTTP only; 0: any free port."),
    ports_file: Optional[Path] = typer.Option(None, "--ports-file", help="Once both front ends listen, write "
                                              '{"host", "http", "grpc"} here (JSON, atomically): the ports a '
                                              "script needs after --port 0 / --grpc-port 0."),
) -> None:
    """Serve models over HTTP and gRPC, batching requests on the fly.
    KServe v2 /v2/models/NAME/infer (and gRPC ModelInfer on --grpc-port), POST /v1/classify, /metrics,
    a page at /.

    Examples:

      inceptionlab serve runs/inception_v3/imagefolder/20261122-101500

      inceptionlab serve --model inception_v3 --weights random --backend onnxruntime --port 8000

      curl -s --data-binary @dog.jpg 'http://127.0.0.1:8000/v1/classify?model=inception_v3'

      inceptionlab serve RUN_DIR --grpc-port off    # HTTP only

      inceptionlab serve RUN_DIR --port 0 --grpc-port 0 --ports-file ports.json   # free ports, for scripts

      inceptionlab serve RUN_DIR --explain          # + curl --data-binary @dog.jpg .../v1/explain -o cam.png
    """
    # start-up time: torch, FastAPI and uvicorn (~3 s) load when the command runs, never for `inceptionlab --help`
    from inceptionlab.runtime import resolve_device
    from inceptionlab.serve.app import API_KEY_ENV, create_app
    from inceptionlab.serve.models import BACKENDS, ModelLoadSettings, load_served_model
    from inceptionlab.serve.server import serve_forever
    from inceptionlab.serve.service import RequestSettings

    if backend not in BACKENDS:
        raise UserError(f"--backend {backend!r}: use one of {', '.join(BACKENDS)}")
    runs = [*(runs or []), *run]
    if not runs and not model:
        raise UserError("give run directories to serve, or --model NAME (e.g. --model inception_v3)")
    # Every value is checked before the ports: a bad one is the error whatever else listens there.
    settings = ModelLoadSettings(backend, precision, str(resolve_device(device)), _positive("--max-batch", max_batch),
                                 _positive("--instances", instances), weights,
                                 log=lambda message: typer.echo(message, err=True),
                                 max_delay_ms=_delay(max_delay_ms), fresh=calibrate, slo_ms=slo_ms,
                                 tta=options.check_tta(tta))
    grpc_number = _grpc_port(grpc_port)
    for option, number in (("--port", port), ("--grpc-port", grpc_number)):
        _check_free(host, number, option)  # before loading models, which can take minutes
    key = api_key or os.environ.get(API_KEY_ENV) or None
    if key is None and not _loopback(host):
        typer.echo(f"warning: --host {host} accepts requests from the network and no API key is set: anyone who "
                   f"can reach the port can use the models; set --api-key KEY (or {API_KEY_ENV})", err=True)
    served, sources = [], []
    for name, run_dir in (_named(r) for r in runs or []):
        served.append(load_served_model(settings, run_dir=run_dir, name=name))
        sources.append((served[-1], run_dir))
    for name in model:
        served.append(load_served_model(settings, model=name))
        sources.append((served[-1], None))
    names = [m.name for m in served]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise UserError(f"two models are named {duplicates[0]!r}: name them, e.g. NAME=RUN_DIR")
    for m in served:
        typer.echo(f"serving {m.describe()}")
    grpc_address = None if grpc_number is None else f"{_bracketed(host)}:{grpc_number}"
    app = create_app(served, RequestSettings(settings.max_delay_ms, max_queue, timeout_s, int(max_body_mb * 2**20), key,
                                             max_concurrency=max_concurrency),
                     grpc_address, _explainers(sources, weights, device) if explain else None)

    def say_ready(http_port: int, bound_grpc: int | None) -> None:
        """The ports really bound (--port 0 / --grpc-port 0 pick free ones), said and written for scripts."""
        if ports_file is not None:
            atomic_write_json(ports_file, {"host": host, "http": http_port, "grpc": bound_grpc})
        grpc_note = "" if bound_grpc is None else f", gRPC at {_bracketed(host)}:{bound_grpc}"
        typer.echo(f"ready: http://{_bracketed(host)}:{http_port}/ (KServe v2 at /v2, metrics at /metrics{grpc_note}"
                   f"{', API key required' if key else ''}); SIGTERM drains and exits")

    serve_forever(app, host, port, drain_s, on_ready=say_ready)


def _explainers(sources: list, weights: Optional[str], device: str) -> Any:
    """Grad-CAM for each served image model, on its eager PyTorch model (whatever runtime serves /infer)."""
    # start-up time: torch, as in serve()
    from inceptionlab.judge.explain import Explainer
    from inceptionlab.infer.source import load_source
    from inceptionlab.runtime import resolve_device
    from inceptionlab.serve.explain import ExplainService

    explainers = {}
    for served, run_dir in sources:
        if not served.is_image:
            continue
        source = load_source(run_dir=run_dir, weights=weights) if run_dir is not None else \
            load_source(model=served.spec.arch, weights=weights)
        explainers[served.name] = Explainer(source.model, source.spec, resolve_device(device), rule=served.rule)
        typer.echo(f"explaining {served.name} with Grad-CAM at {explainers[served.name].layer} (POST /v1/explain)")
    return ExplainService(explainers)


def _named(arg: Path) -> tuple[Optional[str], Path]:
    text = str(arg)
    if "=" in text and not Path(text).exists():
        name, path = text.split("=", 1)
        return name, Path(path)
    return None, arg


def register(root: typer.Typer) -> None:
    root.command("serve")(serve)


def _positive(option: str, value: str) -> int | None:
    """--max-batch / --instances: a positive integer, or auto (None: measured at start-up)."""
    if value == "auto":
        return None
    if not value.isdigit() or int(value) < 1:
        raise UserError(f"{option} {value!r}: give a positive integer or auto")
    return int(value)


def _delay(value: str) -> float | None:
    """--max-delay-ms: milliseconds >= 0, or auto (None: decided with the serving plan)."""
    if value == "auto":
        return None
    try:
        delay = float(value)
    except ValueError:
        delay = -1.0
    if not delay >= 0:
        raise UserError(f"--max-delay-ms {value!r}: give milliseconds >= 0 or auto")
    return delay


def _grpc_port(value: str) -> int | None:
    """--grpc-port: a port number (0: any free port), or off (None)."""
    if value == "off":
        return None
    if not value.isdigit() or int(value) > 65535:
        raise UserError(f"--grpc-port {value!r}: give a port number (0-65535) or off")
    return int(value)


def _loopback(host: str) -> bool:
    """Only this machine can reach `host`: localhost or a loopback address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _check_free(host: str, port: int | None, option: str) -> None:
    """Refuse a port another process listens on, before the models load."""
    reason = port_in_use(host, port) if port else None
    if reason:
        raise UserError(f"{option} {port}: cannot listen on {host}:{port} ({reason}); pick another port"
                        + (" or --grpc-port off" if option == "--grpc-port" else ""))
