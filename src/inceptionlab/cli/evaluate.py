"""`inceptionlab evaluate`: loss, top-1, top-5, per-class accuracy and a confusion matrix."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer

from inceptionlab.cli import options
from inceptionlab.errors import UserError


def evaluate(
    run_dir: Optional[Path] = options.run_argument(),
    run: Optional[Path] = options.run_option(),
    model: Optional[str] = options.model_option(),
    weights: Optional[str] = options.weights_option(),
    data: Optional[Path] = typer.Option(None, "--data", help="Dataset folder (default: the run's data.root)."),
    split: Optional[str] = typer.Option(None, "--split", help="Split folder to score (default: the recipe's val split)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Where to write eval.json, confusion.csv, plots/ and the "
                                       "per-image results.csv + logits.npy (default: RUN/eval)."),
    batch_size: int = options.batch_size_option(64),
    num_workers: Optional[int] = options.num_workers_option(),
    device: str = options.device_option(),
    as_json: bool = options.json_option("one object with loss, top1, top5, per_class, per_class_samples, samples, "
                                        "files"),
) -> None:
    """Score a model on a labelled image split.

    Examples:

      inceptionlab evaluate runs/inception_v3/tiny_imagenet/20261122-101500

      inceptionlab evaluate --model inception_v3 --data data/tiny-imagenet-200 --json

    Besides the summary it writes one row per image (results.csv, logits.npy): `inceptionlab report`
    turns them into a page of the model's errors.
    """
    from inceptionlab.infer.evaluate import evaluate_pretrained, evaluate_run, save_evaluation
    from inceptionlab.runtime import resolve_device

    run = options.pick_run(run_dir, run)
    options.pick_source(run, model)
    dev = resolve_device(device)
    if run is not None:
        evaluation = evaluate_run(run, data, split, device=dev, batch_size=batch_size, num_workers=num_workers,
                                  weights=Path(weights) if weights else None)
        out = out or run / "eval"
    else:
        if data is None:
            raise UserError("--model needs --data DIR: class folders named by ImageNet wnid or label")
        evaluation = evaluate_pretrained(model, weights or "imagenet", data, device=dev, batch_size=batch_size,
                                         num_workers=num_workers)
        out = out or Path("runs") / "evaluate" / model / time.strftime("%Y%m%d-%H%M%S")
    paths = save_evaluation(evaluation, out)
    report = evaluation.report()
    if as_json:
        print(json.dumps({**report, "files": {k: str(v) for k, v in paths.items()}}))
        return
    _print_table(report)
    print(f"wrote {paths['json']}, {paths['confusion_csv']}, {paths['confusion_png']}")
    if "results_csv" in paths:
        print(f"per-image results: {paths['results_csv']}; browse the errors: inceptionlab report {out}")


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
