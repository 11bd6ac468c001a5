"""`inceptionlab plot`: redraw a run directory's plots from its files."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from inceptionlab.cli import options
from inceptionlab.errors import UserError


def plot(run_dir: Optional[Path] = options.run_argument(), run: Optional[Path] = options.run_option()) -> None:
    """Draw plots/loss.png, plots/accuracy.png and plots/confusion.png from the run's files.

    Example: inceptionlab plot runs/demo/digits/20261122-101500
    """
    run = options.pick_run(run_dir, run)
    if run is None:
        raise UserError("give a run directory: inceptionlab plot RUN_DIR")
    # start-up time: torch and matplotlib (~2 s) load when the command runs, never for `inceptionlab --help`
    from inceptionlab.bench_plots import plot_bench_run
    from inceptionlab.checkpoint import RunDir
    from inceptionlab.plots import plot_run

    for path in plot_run(RunDir.open(run).path):
        print(path)
    for path in plot_bench_run(RunDir.open(run).path):
        print(path)


def register(root: typer.Typer) -> None:
    root.command("plot")(plot)
