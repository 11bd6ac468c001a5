"""What fine-tuning's extras cost: the weights' average per step, and head-only epochs on cached features.

1. **EMA per step** against a training step of Inception v3 at 299 px (aux head on, SGD), on this
   machine: the step and the average's update timed alternately, several rounds, medians. Target: the
   update under 5% of the step.
2. **Head-only epochs on cached features** against whole-model epochs on the same data: one run of
   `finetune.freeze_epochs=1`, `train.epochs=2` on an image folder; epoch 1 trains the head on the body's
   features (computed once, their cost reported apart), epoch 2 the whole model. Target: the head
   epoch (training + validation) at least 10x faster than the whole-model epoch.

    python benchmarks/finetune_costs.py                      # Inception v3, 299 px, 256 tiny-imagenet images
    python benchmarks/finetune_costs.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import transfer  # this folder's sibling module: the tiny-imagenet class split and links
from _results import write_result


def ema_cost(batch: int, size: int, rounds: int) -> dict[str, float]:
    import torch

    from inceptionlab.config import EmaConfig, OptimConfig
    from inceptionlab.engine.ema import ModelEma
    from inceptionlab.engine.loop import StepSettings, train_step
    from inceptionlab.engine.optim import build_optimizer
    from inceptionlab.engine.task import make_task
    from inceptionlab.models.registry import build_model

    torch.manual_seed(0)
    aux = 0.4 if size >= 299 else None  # the aux head needs 299 px (the smoke run's 75 px drops it)
    model = build_model("inception_v3", 200, None, aux).model
    ema = ModelEma(model, EmaConfig(decay=0.9998))
    optimizer = build_optimizer(model.parameters(), OptimConfig(lr=0.01))
    task, scaler = make_task("multiclass", 200, aux_loss_weight=aux), torch.amp.GradScaler("cpu", enabled=False)
    inputs, targets = torch.randn(batch, 3, size, size), torch.randint(0, 200, (batch,))
    settings = StepSettings(torch.device("cpu"))
    train_step(model, task, optimizer, scaler, settings, inputs, targets)  # first-call costs apart
    ema.update(model)
    steps, updates = [], []
    for _ in range(rounds):  # alternating, so a change of load hits both
        start = time.perf_counter()
        train_step(model, task, optimizer, scaler, settings, inputs, targets)
        steps.append(time.perf_counter() - start)
        start = time.perf_counter()
        ema.update(model)
        updates.append(time.perf_counter() - start)
    step, update = statistics.median(steps), statistics.median(updates)
    return {"step_s": step, "ema_s": update, "share": update / step}


def calibrated_random_weights(work: Path, size: int, aux: float | None) -> Path:
    """Random Inception v3 weights whose BatchNorm statistics were measured on random images, as a weights file.

    The stand-in for pretrained weights (none can be had here) in the frozen-body epoch: a random init's
    running statistics (mean 0, variance 1) let the eval-mode body's activations grow through its ~90
    layers, and the head then diverged on them (loss 1.8e25 in the head epoch, NaN in the next, 2-core
    AMD EPYC). Pretrained weights' statistics are measured, as these are."""
    import torch

    from inceptionlab.fileio import atomic_torch_save
    from inceptionlab.models.registry import build_model

    path = work / f"inception_v3-random-bn-measured-{size}px.pt"
    if path.is_file():
        return path
    torch.manual_seed(0)
    model = build_model("inception_v3", 1000, None, aux).model
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.reset_running_stats()
            module.momentum = None  # a cumulative average over the calibration batches
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(torch.randn(8, 3, size, size))
    atomic_torch_save(model.state_dict(), path)  # a cache: never a half-written file
    return path


def feature_epochs(folder: Path, work: Path, sets: list[str]) -> dict[str, float]:
    rows_summary = transfer.train([f"data.root={folder}", "train.epochs=2", "finetune.freeze_epochs=1",
                                   "train.log_every=1000", "data.num_workers=0", *sets], work / "finetune-costs-runs")
    run = Path(rows_summary["run_dir"])
    rows = {row["epoch"]: row for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    head = rows[1]["epoch_seconds"] + rows[1]["val_seconds"]  # rows[0]: the starting weights, scored before step 1
    whole = rows[2]["epoch_seconds"] + rows[2]["val_seconds"]
    features = rows_summary.get("features", {})
    return {"head_epoch_s": head, "whole_epoch_s": whole, "speedup": whole / head,
            "features_s": features.get("seconds"), "features_images": features.get("images_computed")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("INCEPTIONLAB_SHARED_DATA", "../shared/data")))
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--batch", type=int, default=8, help="EMA: the training step's batch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--classes", type=int, default=32, help="features: classes of set B, 8 images each")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    from inceptionlab import hardware

    work = args.work or hardware.cache_root() / "transfer"
    size, batch, rounds, classes = (75, 2, 2, 2) if args.smoke else (299, args.batch, args.rounds, args.classes)
    rows = []
    ema = ema_cost(batch, size, rounds)
    aux = " + aux head" if size >= 299 else ""
    rows.append({"what": f"EMA update per step (Inception v3{aux}, {size} px, batch {batch})",
                 "a": ema["ema_s"] * 1000, "b": ema["step_s"] * 1000, "ratio": f"{ema['share']:.2%} of a step",
                 "target": "under 5%", "met": ema["share"] < 0.05})
    root = transfer.tiny_imagenet(args.data)
    settings = transfer.Settings(**{**transfer.FULL.__dict__, "classes": classes, "labels": 8, "val_per_class": 8})
    _, folder = transfer.build_task_folders(root, work, settings)
    weights = calibrated_random_weights(work, size, 0.4 if size >= 299 else None)
    model = ["model.name=inception_v3", f"model.weights={weights}", "optim.lr=0.01", f"data.train_crop_size={size}",
             f"data.val_resize_size={size}", f"data.val_crop_size={size}", "train.batch_size=8", "train.precision=fp32",
             "train.channels_last=false", "train.compile=false"]
    costs = feature_epochs(folder, work, model)
    rows.append({"what": f"head-only epoch on cached features vs whole-model epoch (Inception v3, {size} px, "
                         f"{classes * 16} images, train + validation)",
                 "a": costs["head_epoch_s"] * 1000, "b": costs["whole_epoch_s"] * 1000,
                 "ratio": f"{costs['speedup']:.0f}x faster; features once: {costs['features_s']:.1f} s",
                 "target": "at least 10x", "met": costs["speedup"] >= 10})
    write_result("finetune_costs", rows, title="What fine-tuning's extras cost on this machine"
                 + (" (smoke settings: not a result)" if args.smoke else ""),
                 columns=[("what", "measured"), ("a", "ms", ".1f"), ("b", "against, ms", ".1f"), ("ratio", "ratio"),
                          ("target", "target"), ("met", "met")],
                 settings={"batch": batch, "size": size, "rounds": rounds, "classes": classes, "smoke": args.smoke},
                 details={"ema": ema, "features": costs})


if __name__ == "__main__":
    main()
