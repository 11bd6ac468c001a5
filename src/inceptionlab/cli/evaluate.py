"""`inceptionlab evaluate`: loss, top-1, top-5, per-class accuracy and a confusion matrix."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer

from inceptionlab.errors import UserError


def evaluate(
    run: Optional[Path] = typer.Argument(None, help="A run directory made by `inceptionlab train`."),
    model: Optional[str] = typer.Option(None, "--model", help="Evaluate a pretrained torchvision model instead."),
    weights: str = typer.Option("imagenet", "--weights", help="With --model: 'imagenet' or a state_dict file."),
    data: Optional[Path] = typer.Option(None, "--data", help="Dataset folder (default: the run's data.root)."),
    split: Optional[str] = typer.Option(None, "--split", help="Split folder to score (default: the recipe's val split)."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="Weights file in the run (default model.pt, else best.pt)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Where to write eval.json, confusion.csv, plots/ (default: RUN/eval)."),
    batch_size: int = typer.Option(64, "--batch-size", min=1),
    num_workers: Optional[int] = typer.Option(None, "--num-workers", min=0),
    device: str = typer.Option("auto", "--device"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: loss, top1, top5, per_class, ..."),
) -> None:
    """Score a model on a labelled image split.

    Examples:

      inceptionlab evaluate runs/inception_v3/tiny_imagenet/20261122-101500

      inceptionlab evaluate --model inception_v3 --data data/tiny-imagenet-200 --json
    """
    from inceptionlab.infer.evaluate import evaluate_pretrained, evaluate_run, save_evaluation
    from inceptionlab.infer.predict import resolve_device

    if (run is None) == (model is None):
        raise UserError("give a RUN_DIR or --model NAME (one of them)")
    dev = resolve_device(device)
    if run is not None:
        evaluation = evaluate_run(run, data, split, device=dev, batch_size=batch_size, num_workers=num_workers,
                                  weights=checkpoint)
        out = out or run / "eval"
    else:
        if data is None:
            raise UserError("--model needs --data DIR: class folders named by ImageNet wnid or label")
        evaluation = evaluate_pretrained(model, weights, data, device=dev, batch_size=batch_size,
                                         num_workers=num_workers)
        out = out or Path("runs") / "evaluate" / model / time.strftime("%Y%m%d-%H%M%S")
    paths = save_evaluation(evaluation, out)
    report = evaluation.report()
    if as_json:
        print(json.dumps({**report, "files": {k: str(v) for k, v in paths.items()}}))
        return
    _print_table(report)
    print(f"wrote {paths['json']}, {paths['confusion_csv']}, {paths['confusion_png']}")


def _print_table(report: dict) -> None:
    per_class, counts = report["per_class"], report["per_class_samples"]
    width = max([len(k) for k in per_class] + [5])
    print(f"{'class':<{width}}  {'n':>5}  accuracy")
    for label, acc in sorted(per_class.items(), key=lambda kv: (kv[1] is None, kv[1])):
        print(f"{label:<{width}}  {counts[label]:>5}  {'-' if acc is None else f'{acc:.3f}'}")
    top5 = f"  top-5 {report['top5']:.4f}" if "top5" in report else ""
    print(f"\n{report['samples']} samples  loss {report['loss']:.4f}  top-1 {report['top1']:.4f}{top5}")


def register(root: typer.Typer) -> None:
    root.command("evaluate")(evaluate)
