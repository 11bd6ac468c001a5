"""`inceptionlab demo` (= `make demo`): the main job end to end on embedded data, no network.

Builds an ImageFolder from scikit-learn's real handwritten digits, trains Inception v3 on it at
80 px on the CPU (about 100 s on 2 cores), evaluates it, plots the curves and the confusion
matrix, and classifies a few held-out test images.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer


def demo(
    out: Path = typer.Option(Path("runs"), "--out", help="Parent folder of the run directory."),
    data: Path = typer.Option(Path("runs/data/digits"), "--data", help="Where the digits ImageFolder is written."),
    overrides: List[str] = typer.Option([], "--set", help="Override a recipe value, e.g. --set train.epochs=2."),
    samples: int = typer.Option(8, "--samples", min=1, help="How many held-out test images to classify."),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress"),
) -> None:
    """Train, evaluate, plot and predict on scikit-learn's digits: the whole pipeline in minutes.

    Example: inceptionlab demo --set train.epochs=2
    """
    # start-up time: torch (~1-2 s) loads when the command runs, never for `inceptionlab --help`
    from inceptionlab.engine.choices import load_training_recipe as load_recipe
    from inceptionlab.engine.fit import fit
    from inceptionlab.infer.predict import Predictor
    from inceptionlab.models.registry import load_run_model
    from inceptionlab.runtime import resolve_device

    recipe = load_recipe("demo/digits", [f"data.root={data}", *overrides])
    print(f"demo: Inception v3 on scikit-learn digits ({recipe.train.epochs} epochs at "
          f"{recipe.data.train_crop_size} px); data in {data}")
    outcome = fit(recipe, out, progress=progress)
    best = outcome.summary["best"]
    print(f"\nvalidation: top-1 {best['top1']:.3f}, top-5 {best['top5']:.3f} at epoch {best['epoch']} "
          f"(chance: 0.100); curves in {outcome.run_dir / 'plots'}")

    model, spec = load_run_model(outcome.run_dir)
    predictor = Predictor(model, spec, resolve_device(recipe.train.device))
    test_files = _one_per_class(Path(recipe.data.root) / "test", samples)
    print("\nheld-out test images (never seen in training):")
    right = 0
    for result in predictor.predict_files(test_files, topk=1):
        truth = Path(result["file"]).parent.name
        guess = result["topk"][0]
        right += guess["label"] == truth
        print(f"  {Path(result['file']).name}  true {truth}  predicted {guess['label']} ({guess['prob']:.0%})")
    print(f"  {right}/{len(test_files)} right")
    print(f"\nrun directory: {outcome.run_dir}")
    print(f"next: inceptionlab evaluate {outcome.run_dir}   |   "
          f"inceptionlab predict --run {outcome.run_dir} {Path(recipe.data.root) / 'test'}")


def _one_per_class(folder: Path, count: int) -> list[Path]:
    """Up to `count` test images, cycling through the classes so every digit shows up."""
    per_class = [sorted(d.glob("*.png")) for d in sorted(folder.iterdir()) if d.is_dir()]
    picked: list[Path] = []
    for round_ in range(max((len(files) for files in per_class), default=0)):
        for files in per_class:
            if len(picked) < count and round_ < len(files):
                picked.append(files[round_])
    return picked


def register(root: typer.Typer) -> None:
    root.command("demo")(demo)
