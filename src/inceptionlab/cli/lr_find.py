"""`inceptionlab lr-find`: the learning-rate range test of a recipe, for the head and for the whole model."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, List, Optional

import typer

from inceptionlab.errors import UserError
from inceptionlab.fileio import atomic_write_json


def lr_find(
    recipe: str = typer.Argument(..., help="Recipe name (see `inceptionlab recipes`) or YAML path."),
    data: Optional[Path] = typer.Option(None, "--data", help="Dataset folder (sets data.root)."),
    overrides: List[str] = typer.Option([], "--set", help="Override a recipe value: --set model.weights=RUN_DIR (repeatable)."),
    steps: int = typer.Option(100, "--steps", min=5, help="Steps per range test (one rate each)."),
    start: float = typer.Option(1e-7, "--start", min=0.0, help="First learning rate."),
    end: float = typer.Option(10.0, "--end", min=0.0, help="Last learning rate (the test stops earlier if the loss diverges)."),
    out: Path = typer.Option(Path("runs/lr-find"), "--out", help="Parent folder of the result (plot and JSON)."),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="Progress bars (default: on a terminal)."),
    as_json: bool = typer.Option(False, "--json", help="Print the suggestions and both curves as one JSON object."),
) -> None:
    """Find the learning rates to fine-tune with: Smith's range test, for the head, then the whole model.
    The rate rises exponentially, one value per training step, from the recipe's starting weights,
    first for the head alone (the body frozen as in head-only epochs), then for the whole model.
    Suggests optim.lr (the head's steepest descent of the smoothed loss, before its minimum) and
    finetune.body_lr_mult (the whole model's over the head's, at most 1); draws the curves. The weights are not changed: nothing is saved but
    the plot and the numbers.

    Examples:

      inceptionlab lr-find inception_v3/imagefolder --data ~/photos

      inceptionlab lr-find inception_v3/imagefolder --data ~/photos --set model.weights=runs/old/20261122-101500 --json
    """
    # start-up time: torch, matplotlib and tqdm (~2 s) load when the command runs, never for `inceptionlab --help`
    from tqdm import tqdm

    from inceptionlab.checkpoint import RunDir
    from inceptionlab.engine.choices import load_training_recipe
    from inceptionlab.engine.lr_find import RULE, find_learning_rates, recommendation
    from inceptionlab.engine.session import build_training_session
    from inceptionlab.plots import plot_lr_find

    if end <= start or start <= 0:
        raise UserError(f"--start {start} and --end {end}: need 0 < start < end")
    loaded = load_training_recipe(recipe, list(overrides) + ([f"data.root={data}"] if data is not None else []))
    session = build_training_session(loaded)
    say = (lambda line: print(line, file=sys.stderr)) if as_json else print
    for note in session.notes:
        say(note)
    show = sys.stderr.isatty() if progress is None else progress
    parts = iter(("head", "body"))  # find_learning_rates runs the head's test, then the whole model's

    def bar(values):
        part = next(parts, "")
        if show:
            return tqdm(values, desc=f"range test {part}", unit="step", leave=False)
        return progress_lines(values, part, say)

    results = find_learning_rates(session, start, end, steps, progress=bar, say=say)
    folder = RunDir.create(out, loaded.name).path
    tests = {part: test.to_dict() for part, test in results.items()}
    plot = plot_lr_find(tests, folder / "lr_find.png")
    suggested = recommendation(results)
    report = {"recipe": loaded.name, "rule": RULE, "suggested": suggested.values, "notes": suggested.notes,
              "tests": tests, "plot": str(plot)}
    atomic_write_json(folder / "lr_find.json", report)
    if as_json:
        print(json.dumps(report))
        return
    print("\n".join(summary_lines(results, suggested, plot)))


def summary_lines(results: dict, suggested: Any, plot: Path) -> list[str]:
    """What the range tests found, as the command prints it: each test, the rule, notes, the values to set."""
    from inceptionlab.engine.lr_find import RULE  # start-up time: torch, as in lr_find()

    lines = []
    for part, test in results.items():
        found = f"{test.suggestion:.3g}" if test.suggestion else "none (the loss never fell)"
        lines.append(f"{part}: suggested lr {found}; {len(test.lrs)} steps, {test.ended}")
    lines.append(f"rule: {RULE}")
    lines += [f"note: {note}" for note in suggested.notes]
    if suggested.values:
        lines.append("set: " + " ".join(f"--set {key}={value:.3g}" for key, value in suggested.values.items()))
    return [*lines, f"plot: {plot}"]


def progress_lines(values: list[float], part: str, say: Callable[[str], None]) -> Iterator[float]:
    """Without a terminal (a log file, a batch job): a line at every tenth of the test, each rate as its
    step runs, with the time left at the pace so far (a range test of Inception v3 at 299 px on a
    2-core CPU takes most of an hour)."""
    total, started = len(values), time.perf_counter()
    every = max(1, round(total / 10))
    for done, value in enumerate(values, 1):
        yield value  # resumed once this rate's step has run
        if done % every == 0 or done == total:
            elapsed = time.perf_counter() - started
            say(f"range test {part}: step {done}/{total}, lr {value:.3g}, {_minutes(elapsed)} so far, about "
                f"{_minutes(elapsed / done * (total - done))} left")


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def register(root: typer.Typer) -> None:
    root.command("lr-find")(lr_find)
