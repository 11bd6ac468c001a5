"""`inceptionlab train` and `inceptionlab recipes`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List, Optional

import typer

from inceptionlab.data.datasets.file_list import recorded_split
from inceptionlab.errors import UserError


def train(
    recipe: Optional[str] = typer.Argument(None, help="Recipe name (see `inceptionlab recipes`) or YAML path."),
    data: Optional[Path] = typer.Option(None, "--data", help="Dataset folder (sets data.root)."),
    overrides: List[str] = typer.Option([], "--set", help="Override a recipe value: --set optim.lr=0.01 (repeatable)."),
    out: Path = typer.Option(Path("runs"), "--out", help="Parent folder of run directories."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue the run in this run directory."),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="Progress bars (default: on a terminal)."),
    as_json: bool = typer.Option(False, "--json", help="Print the run summary as one JSON object at the end."),
) -> None:
    """Train a recipe; everything lands in one run directory.

    Examples:

      inceptionlab train inception_v3/tiny_imagenet --data data/tiny-imagenet-200

      inceptionlab train inception_v3/tiny_imagenet --set train.epochs=10 --set train.precision=bf16

      inceptionlab train --resume runs/inception_v3/tiny_imagenet/20261122-101500

      torchrun --nproc_per_node=8 -m inceptionlab train inception_v3/tiny_imagenet --data DIR
    """
    # start-up time: torch (~1-2 s) loads when the command runs, never for `inceptionlab --help`
    from inceptionlab.engine.choices import load_training_recipe as load_recipe
    from inceptionlab.engine.distributed import shutdown_distributed
    from inceptionlab.engine.fit import fit

    extra = list(overrides) + ([f"data.root={data}"] if data is not None else [])
    if resume is not None:
        source = resume / "recipe.resolved.yaml"
        if not source.is_file():
            raise UserError(f"{resume}: not a run directory (no recipe.resolved.yaml) to resume")
        if recipe is not None:
            raise UserError("give either a RECIPE or --resume RUN_DIR, not both (use --set to change values)")
        loaded = load_recipe(source, recorded_split(resume) + extra)  # the same images as the run's first part
    elif recipe is None:
        raise UserError("missing RECIPE: e.g. `inceptionlab train inception_v3/tiny_imagenet --data DIR`")
    else:
        loaded = load_recipe(recipe, extra)
    _data_warning(loaded)
    try:
        outcome = fit(loaded, out, resume, progress=progress)
    finally:
        shutdown_distributed()
    if outcome.summary and outcome.status != "interrupted":
        _export_text_model(outcome.run_dir)
    if as_json and outcome.summary:  # rank 0 only under torchrun
        print(json.dumps(outcome.summary, default=str))
    elif outcome.summary:
        best = outcome.summary.get("best") or {}
        scores = "  ".join(f"{k} {best[k]:.4f}" for k in ("top1", "top5", "loss") if k in best)
        if best:
            print(f"{outcome.status}: best {outcome.summary['best_metric']} at epoch {best.get('epoch')}: {scores}")
        else:
            print(f"{outcome.status}: no epoch finished, so nothing was scored yet")
        if "test" in outcome.summary:
            test = outcome.summary["test"]
            print("test: " + "  ".join(f"{k} {test[k]:.4f}" for k in ("top1", "top5", "loss") if k in test))
        print(f"run directory: {outcome.run_dir}")
    if outcome.status == "interrupted":
        raise typer.Exit(130)
    if outcome.status == "diverged":  # the exit code of a diverged run (errors.py), its best weights kept
        raise typer.Exit(3)


def _data_warning(recipe: object) -> None:
    """The data check's cheap part first: one line on stderr when the data looks wrong (rank 0 only)."""
    from inceptionlab.data.readers import data_warning  # start-up time: torch, as in train()

    line = data_warning(recipe.data)  # type: ignore[attr-defined]
    if line and os.environ.get("RANK", "0") == "0":
        typer.echo(line, err=True)


def _export_text_model(run_dir: Path) -> None:
    """A text run also gets exports/text/: a folder that classifies with torch + tokenizers alone."""
    from inceptionlab.infer.text import export_text_run  # start-up time: torch, as in train()

    export_text_run(run_dir)


def recipes(
    show: Optional[str] = typer.Option(None, "--show", help="Print one recipe fully resolved (every key)."),
    as_json: bool = typer.Option(False, "--json", help="JSON output."),
) -> None:
    """List the shipped recipes, or print one with every key resolved.

    Example: inceptionlab recipes --show inception_v3/tiny_imagenet
    """
    # start-up time: torch (~1-2 s) loads when the command runs, never for `inceptionlab --help`
    from inceptionlab.config import list_recipes, recipe_to_dict, recipe_to_yaml
    from inceptionlab.engine.choices import load_training_recipe as load_recipe

    if show:
        recipe = load_recipe(show)
        print(json.dumps(recipe_to_dict(recipe)) if as_json else recipe_to_yaml(recipe), end="" if not as_json else "\n")
        return
    rows = list_recipes()
    if as_json:
        print(json.dumps([{"name": n, "description": d} for n, d in rows]))
        return
    width = max(len(n) for n, _ in rows)
    for name, description in rows:
        print(f"{name:<{width}}  {description}")


def register(root: typer.Typer) -> None:
    root.command("train")(train)
    root.command("recipes")(recipes)
