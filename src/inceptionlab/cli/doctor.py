"""`inceptionlab doctor`: print the installation check from `inceptionlab.doctor`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from inceptionlab.doctor import DoctorReport

STATUS_WIDTH = 6
NAME_WIDTH = 17


def register(root: typer.Typer) -> None:
    root.command("doctor")(doctor)


def doctor(
    json_output: bool = typer.Option(False, "--json", help="Print one JSON object instead of text."),
    expect_gpu: bool = typer.Option(
        False, "--expect-gpu", help="Fail unless torch sees a GPU, even without GPU hardware evidence."
    ),
    train_check: bool = typer.Option(
        False, "--train-check", help="Also train a small CNN on the embedded digits on every device."
    ),
    train_seconds: float = typer.Option(
        3.0, "--train-seconds", min=0.0, help="Training time per device for --train-check (after 30 steps)."
    ),
    calibrate: bool = typer.Option(
        False, "--calibrate", help="Measure the speed settings afresh on every device (~1 minute on 2 CPU cores)."
    ),
) -> None:
    """Check the install: versions, build, GPUs, a real Conv2d on each device.

    --train-check trains a small CNN on scikit-learn's digits on the CPU and
    every visible GPU for a few seconds each: it passes when the loss falls to
    under half its start and held-out top-1 reaches 0.8, and reports images/s.

    Exits 0 when no check fails, 1 otherwise.

    A GPU is expected with --expect-gpu or when /dev/kfd, /dev/nvidia0,
    nvidia-smi or rocminfo exists; if torch then sees none, the failing
    `gpu` check lists the likely causes.

    When the torch build is why a GPU is not seen, the check names the set-up
    command that fixes it (`make clean setup TORCH_FROM_SYSTEM=1` or TORCH_INDEX=...).

    The "speed settings" table shows what `auto` picks on each device for the demo's training, the
    fine-tuning recipe and serving Inception v3, and why: from this machine's speed cache when a run
    measured it, else from the capability probe alone; --calibrate measures afresh.

    Example: inceptionlab doctor --expect-gpu

    Example: inceptionlab doctor --train-check --json
    """
    # start-up time: torch (~1-2 s) loads when the command runs, never for `inceptionlab --help`
    from inceptionlab.doctor import run_doctor
    from inceptionlab.doctor.speed import format_rows, speed_settings
    from inceptionlab.doctor.train_check import TrainCheckSettings

    train = TrainCheckSettings(seconds=train_seconds) if train_check else None
    report = run_doctor(expect_gpu=expect_gpu, train=train)
    speed = speed_settings([d["device"] for d in report.devices if "error" not in d], calibrate=calibrate)
    if json_output:
        typer.echo(json.dumps({**report.to_dict(), "speed_settings": [row.to_dict() for row in speed]}, indent=2))
    else:
        lines = format_report(report)
        typer.echo("\n".join(lines[:-1] + [""] + format_rows(speed) + [""] + lines[-1:]))  # the verdict last
    if not report.ok:
        raise typer.Exit(1)


def format_report(report: DoctorReport) -> list[str]:
    lines = []
    for check in report.checks:
        lines += format_check(check.status, check.name, check.detail)
    failed = [c.name for c in report.failed_checks()]
    warned = [c.name for c in report.checks if c.status == "warn"]
    if failed:
        lines.append(f"unhealthy: {len(failed)} failing check(s): {', '.join(failed)}")
    else:
        note = f" ({len(warned)} warning(s): {', '.join(warned)})" if warned else ""
        lines.append(f"healthy: all {len(report.checks)} checks passed{note}")
    return lines


def format_check(status: str, name: str, detail: str) -> list[str]:
    # Continuation lines (e.g. the list of causes) line up under the detail column.
    first, *rest = detail.splitlines() or [""]
    indent = " " * (STATUS_WIDTH + NAME_WIDTH)
    return [f"{status:<{STATUS_WIDTH}}{name:<{NAME_WIDTH}}{first}"] + [indent + line for line in rest]
