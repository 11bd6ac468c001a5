"""`inceptionlab bench`: inference latency and throughput across runtimes, precisions, batch sizes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from inceptionlab import hardware
from inceptionlab.cli import options
from inceptionlab.fileio import append_jsonl


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def bench(
    ctx: typer.Context,
    run_dir: Optional[Path] = options.run_argument("A run directory (results go to RUN_DIR/bench/results.jsonl)."),
    run: Optional[Path] = options.run_option(),
    model: Optional[str] = options.model_option(),
    weights: Optional[str] = options.weights_option(),
    backend: str = typer.Option("eager", "--backend", help="Comma list: eager, compile, onnxruntime, openvino; "
                                "auto: the runtime `serve --backend auto` serves on here."),
    precision: str = typer.Option("auto", "--precision", help="Comma list: fp32, bf16, fp16, int8; auto: fp32 and "
                                                             "the reduced float precisions this device has units for."),
    layout: str = typer.Option("auto", "--layout", help="PyTorch backends: comma list of nchw, channels_last; "
                                                         "auto: both."),
    batch: str = typer.Option("1", "--batch", help="Comma list of batch sizes, e.g. 1,8,32."),
    tta: str = typer.Option("none", "--tta", help="Comma list of test-time augmentations to time around each "
                            "configuration: none, flip, crops, flip-crops (e.g. none,flip: the speed-up column is "
                            "TTA's cost)."),
    iters: int = typer.Option(100, "--iters", min=1, help="Timed calls per configuration and batch size."),
    rounds: int = typer.Option(5, "--rounds", min=1, help="Rounds the timed calls are split into; in each round "
                                                          "the configurations take turns, so a load that comes "
                                                          "and goes beside the bench slows every row alike."),
    warmup: int = typer.Option(10, "--warmup", min=0, help="Untimed calls after the first."),
    device: str = options.device_option(),
    provider: str = typer.Option("auto", "--provider", help="onnxruntime: auto | cpu | cuda | tensorrt | migraphx."),
    tune: bool = typer.Option(False, "--tune", help="Tuning step: torch.compile max-autotune, exhaustive "
                                                     "cuDNN/MIGraphX search, TensorRT level 5."),
    onnx: Optional[Path] = typer.Option(None, "--onnx", help="Use this ONNX file instead of the model's own export."),
    calib_images: List[Path] = typer.Option(
        [], "--calib-images", help="Real images for int8 calibration and the agreement check (folders or "
                                   "files; default: the guide's sample pictures and the run's val data)."),
    holdout_images: List[Path] = typer.Option(
        [], "--holdout-images", help="Judge agreement on these images instead (e.g. a val split; calibrate "
                                     "on --calib-images, e.g. train)."),
    holdout: int = typer.Option(200, "--holdout", min=1, help="Held-out images for the agreement check."),
    calibration: int = typer.Option(100, "--calibration", min=1, help="Calibration images for int8."),
    min_agreement: float = typer.Option(0.99, "--min-agreement", min=0.0, max=1.0,
                                        help="Top-1 agreement with fp32 needed to call a model usable."),
    out: Optional[Path] = typer.Option(None, "--out", help="--model: its folder is OUT/<name>/ (default: "
                                       "runs/exports). A run's export is RUN_DIR/exports/."),
    plot: bool = typer.Option(True, "--plot/--no-plot", help="Draw plots/bench_*.png from the results."),
    list_runtimes: bool = typer.Option(False, "--list", help="List runtimes, precisions and providers here; no timing."),
    as_json: bool = options.json_option("one object per configuration and batch size"),
) -> None:
    """Time inference over backends, precisions and batch sizes, and judge reduced precisions.
    First call apart, warm-up, synchronised calls; mean/p50/p90/p99 latency, images/s,
    GFLOP/s; for bf16/fp16/int8 the top-1 agreement with fp32 on held-out real images and whether that
    makes the model usable (>= 99% on >= 200 images). Several configurations print one table with the
    speed-up against eager fp32 NCHW; they take turns in --rounds rounds, and each row records other
    processes' CPU use meanwhile (a warning says when the machine was not quiet) and how far its rounds
    spread. img/s and the speed-up come from the median. Rows are appended to bench/results.jsonl.

    Examples:

      inceptionlab bench --list

      inceptionlab bench --model inception_v3 --weights random --backend eager,onnxruntime,openvino --precision fp32,bf16,int8 --batch 1,16 --calib-images val/

      inceptionlab bench runs/inception_v3/imagefolder/20261122-101500 --backend onnxruntime --precision int8 --json

      inceptionlab bench RUN_DIR --backend openvino --precision fp32 --tta none,flip,flip-crops --batch 1,8
    """
    # start-up time: torch (~1-2 s) loads when the command runs, never for `inceptionlab --help`
    from inceptionlab.infer.bench import (
        BenchSettings, busy_warning, parse_batches, parse_list, plan, result_records, run_bench,
    )
    from inceptionlab.infer.runtimes import (
        PRECISIONS, RUNTIMES, TORCH_LAYOUTS, Target, auto_backend, check_provider_name, describe_runtimes,
    )
    from inceptionlab.infer.source import load_source
    from inceptionlab.runtime import environment, resolve_device

    if list_runtimes:
        _print_runtimes(describe_runtimes(), as_json)
        return
    check_provider_name(provider)
    target = Target(str(resolve_device(device)), provider, tune)
    facts = hardware.device_facts(target.device)
    precisions = parse_list(precision, ("auto", *PRECISIONS), "--precision")
    backends = [auto_backend(target.device, "image") if name == "auto" else name
                for name in parse_list(backend, (*RUNTIMES, "auto"), "--backend")]
    configs = plan(list(dict.fromkeys(backends)), precisions,
                   parse_list(layout, ("auto", *TORCH_LAYOUTS), "--layout"), facts,
                   parse_list(tta, options.TTA_MODES, "--tta"))
    settings = BenchSettings(parse_batches(batch), iters, warmup, target, list(calib_images), list(holdout_images),
                             holdout, calibration, min_agreement, onnx, rounds)
    run = options.pick_run(run_dir, run)
    options.pick_source(run, model)
    source = load_source(run, model, weights, options.exports_folder(run, out))

    def emit(rows: list[dict]) -> None:
        if as_json:
            for row in rows:
                print(json.dumps(row), flush=True)

    _announce(facts, precisions)  # after every option is checked: a bad one stays a one-line error
    report = run_bench(source, configs, settings, log=_log, on_rows=emit)
    env = environment(target.device, gpu_settings=hardware.backends.record(facts))
    # Every option as parsed (defaults too, the output switches left out): rerunning it reproduces the row.
    command = options.canonical_command(ctx, skip=("as_json", "plot", "list_runtimes"))
    append_jsonl(source.bench_results, list(result_records(report, source, settings, command, env)))
    if not as_json:
        _print_table(report, source, env, settings)
    elif busy_warning(report):
        _log(f"warning: {busy_warning(report)}")
    _log(f"results appended to {source.bench_results}")
    if plot:
        from inceptionlab.bench_plots import plot_bench_run  # start-up time: matplotlib (~0.4 s), only when drawing

        for path in plot_bench_run(source.home):
            _log(f"plot {path}")


def _announce(facts, precisions: list[str]) -> None:
    """Before minutes are spent: what `auto` left out here, and any named precision that is emulated."""
    from inceptionlab.infer.bench import auto_precisions  # start-up time: torch, as in bench()

    if "auto" in precisions:
        found, ruled_out = auto_precisions(facts)
        dropped = "; ".join(f"{name}: {why}" for name, why in ruled_out.items())
        _log(f"--precision auto on {facts.describe()}: {', '.join(found)}" + (f" (not {dropped})" if dropped else ""))
    for name in precisions:
        warning = hardware.emulation_warning(facts, name)
        if warning:
            _log(f"warning: {warning}")


def _print_table(report, source, env, settings) -> None:
    from inceptionlab.infer.bench import busy_warning, format_table  # start-up time: torch, as in bench()

    row = report.rows[0]
    flops = f"{row['gflop_per_image']:.1f} GFLOP/image" if row["gflop_per_image"] else "GFLOP unknown"
    print(f"{source.spec.arch} at {source.spec.crop_size} px ({flops}), "
          f"{env['device_name']}, torch threads {env['torch_threads']}; iters {settings.iters} in "
          f"{row['rounds']} rounds, warm-up {settings.warmup}; load average {row['loadavg_1min']}")
    print(format_table(report.rows))
    warning = busy_warning(report)
    if warning:
        print(f"warning: {warning}")
    for skipped in report.skipped:
        print(f"skipped {skipped.config.label}: {skipped.reason}")
    for config, verdict in report.verdicts.items():
        print(f"{config.label}: {'usable' if verdict.usable else 'NOT usable'} ({verdict.reason})")


def _print_runtimes(rows: list[dict], as_json: bool) -> None:
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return
    for row in rows:
        state = "ok     " if row["available"] else "missing"
        print(f"{state} {row['backend']:<12} {','.join(row['precisions']):<20} {row['details']}")
        print(f"        {'':<12} {row['summary']}")


def register(root: typer.Typer) -> None:
    root.command("bench")(bench)
