"""Fine-tuning from real ImageNet weights, measured: the guide's case study (tiny-imagenet) and data ImageNet
has not seen (Fashion-MNIST), with the real bodies tools/real_weights.py caches.

Models: Inception v3 (Google's 2015 body, `model.name=inception_v3_fid`, 299 px) and EfficientNet-Lite0
(`timm/tf_efficientnet_lite0`, 224 px, its own preprocessing from its weights). Tasks (a table: TASKS):

- `tiny200`: tiny-imagenet-200 as it is beside the repository, all 200 classes, its 20 training images each;
  validation: the first `--val-per-class` of each class's 50 (50: all 10,000). ImageNet has seen these
  classes (tiny-imagenet's images come from it): a figure here is not transfer to unseen data.
- `tiny10`: the issue 41 task: 10 of those classes (scorpion ... seashore), 20 photos each to train.
- `fashion10`, `fashion50`, `fashion500`: Fashion-MNIST with 10 / 50 / 500 training labels per class
  (the first of each class in the training file), scored on the first `--val-per-class` x 10 test images;
  written once as PNG folders into the work folder.

Arms (ARMS: a row is a name and the recipe values it adds): `zero_shot` (Lite0 on wnid-named classes: the
pretrained head's rows carried by name, scored before any step: the epoch-0 row of the probe run, no run of
its own), `probe` (the head alone on cached features: finetune.freeze_epochs = epochs), `head_then_whole`
(2 head epochs on cached features, then the whole model, warm-up 1 epoch, layer-wise decay 0.75; BatchNorm
frozen: finetune.bn's default for trained weights) and `whole` (every layer at one rate from the start).
Each arm runs `--seeds` seeds; mean +- std over seeds and the wall time per run are recorded.

    python benchmarks/transfer_real.py --tasks tiny200 --models inception,lite0 --arms probe --seeds 3
    python benchmarks/transfer_real.py --tasks tiny10 --models inception --arms head_then_whole,whole --epochs 4
    python benchmarks/transfer_real.py --smoke            # every code path on 3 classes (minutes)

Runs go through `engine.fit` as `inceptionlab train inception_v3/imagefolder --set ...` would (the command
of each row says so). The result file goes through _results.py (`transfer_real--<machine>--<time>.json`) and
docs/fine-tuning.md renders it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shlex
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _results import write_result  # this folder's sibling module
from transfer import describe, link_folder, train, train_images, val_images  # the tiny-imagenet links

# The issue 41 classes: scorpion, Yorkshire terrier, lesser panda, beaker, binoculars, freight car, maypole,
# police van, volleyball, seashore.
TINY10 = ["n01770393", "n02094433", "n02509815", "n02815834", "n02841315", "n03393912", "n03733131", "n03977966",
          "n04540053", "n09428293"]
# Numbered so that no name matches an ImageNet class (sandal, jersey T-shirt): every head row starts new.
FASHION = ["0-tshirt-top", "1-trouser", "2-pullover", "3-dress", "4-coat", "5-sandal", "6-shirt", "7-sneaker", "8-bag",
           "9-ankle-boot"]
REAL = os.environ.get("INCEPTIONLAB_REAL_WEIGHTS") or str(Path.home() / ".cache/inceptionlab/real-weights")

MODELS = {
    # The guide's preprocessing (342 -> 299, bilinear, ImageNet mean/std; the model's transform_input turns it
    # into the [-1, 1] the 2015 graph was trained on), as inception_v3/tiny_imagenet states it.
    "inception": ("model.name=inception_v3_fid", f"model.weights={REAL}/inception_v3_fid.pt",
                  "model.aux_loss_weight=null", "data.train_crop_size=299", "data.val_resize_size=342",
                  "data.val_crop_size=299", "data.interpolation=bilinear", "data.mean=[0.485,0.456,0.406]",
                  "data.std=[0.229,0.224,0.225]"),
    # Preprocessing from the weights (224 px, bicubic, mean = std = 0.5): the recipe's values emptied.
    "lite0": ("model.name=timm/tf_efficientnet_lite0", f"model.weights={REAL}/tf_efficientnet_lite0.pt",
              "model.aux_loss_weight=null", "data.train_crop_size=null", "data.val_resize_size=null",
              "data.val_crop_size=null", "data.interpolation=null", "data.mean=null", "data.std=null"),
}
# Common to every run: SGD with momentum at batch 32, cosine, label smoothing 0.1, bf16 + channels_last (the
# speed settings this Zen 4 picks when calibration can run; pinned so a loaded machine cannot fall back to
# fp32 mid-benchmark), one loader worker (2 cores).
COMMON = ("optim.name=sgd", "optim.momentum=0.9", "optim.weight_decay=1e-4", "optim.decay_norm_and_bias=false",
          "schedule.name=cosine", "schedule.warmup_epochs=0", "train.label_smoothing=0.1", "train.batch_size=32",
          "train.precision=bf16", "train.channels_last=true", "train.compile=false", "data.loader=workers",
          "data.num_workers=1", "data.hflip=true", "train.log_every=1000",
          # inception_v3/imagefolder is a linear probe by default; the arms train the body unless they say otherwise
          "finetune.body_lr_mult=1")


@dataclass(frozen=True)
class Arm:
    name: str
    what: str
    sets: tuple[str, ...]  # {epochs} is the run's epoch count
    # The recipe's own values and the arm's only: just the model, its weights and the data are given besides (no
    # COMMON, --lr, --epochs or preprocessing).
    recipe_only: bool = False


ARMS = {
    "probe": Arm("probe", "linear probe: the head alone on the frozen body's cached features",
                 ("finetune.freeze_epochs={epochs}",)),
    "head_then_whole": Arm("head_then_whole", "head 2 epochs (cached features), then all: warm-up 1, layer decay 0.75",
                           ("finetune.freeze_epochs=2", "schedule.warmup_epochs=1", "finetune.layer_decay=0.75")),
    "whole": Arm("whole", "every layer at one rate from the start, warm-up 1", ("schedule.warmup_epochs=1",)),
    # inception_v3/imagefolder's default linear probe (lr 0.03, cosine, label smoothing 0.1, 6 epochs), its values
    # given so that older versions run it too; nothing else given: no COMMON, --lr or --epochs, the preprocessing
    # from the weights.
    "probe_recommended": Arm("probe_recommended", "linear probe, inception_v3/imagefolder's default (lr 0.03, cosine, smoothing 0.1, 6 epochs)",
                         ("finetune.body_lr_mult=0", "optim.lr=0.03", "schedule.name=cosine", "train.label_smoothing=0.1",
                          "train.epochs=6"), recipe_only=True),
}


# ----------------------------------------------------------------------------------------- data


def tiny_folder(root: Path, work: Path, wnids: list[str], val_per_class: int) -> Path:
    val = val_images(root)
    folder = work / f"tiny-{len(wnids)}-val{val_per_class}"
    link_folder(folder / "train", {w: train_images(root, w) for w in wnids})
    link_folder(folder / "val", {w: val[w][:val_per_class] for w in wnids})
    return folder


def read_idx(path: Path) -> Any:
    import numpy as np

    data = gzip.decompress(path.read_bytes())
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def fashion_folder(root: Path, work: Path, labels: int, val_per_class: int) -> Path:
    """Fashion-MNIST as an ImageFolder of 28 px PNGs: `train<labels>/` the first `labels` training images of
    each class, `val/` the first `val_per_class` test images of each; written once. One folder for every
    label count, so the validation split's cached features (keyed by the files) are computed once."""
    from PIL import Image

    folder = work / f"fashion-val{val_per_class}"
    if (folder / f".done{labels}").is_file():
        return folder
    for split, prefix, count in ((f"train{labels}", "train", labels), ("val", "t10k", val_per_class)):
        images, targets = read_idx(root / f"{prefix}-images-idx3-ubyte.gz"), read_idx(root / f"{prefix}-labels-idx1-ubyte.gz")
        for c, name in enumerate(FASHION):
            (folder / split / name).mkdir(parents=True, exist_ok=True)
            for i in [i for i in range(len(targets)) if targets[i] == c][:count]:
                Image.fromarray(images[i]).convert("RGB").save(folder / split / name / f"{i:05d}.png")
    (folder / f".done{labels}").write_text("")
    return folder


@dataclass(frozen=True)
class Task:
    name: str
    what: str
    seen_by_imagenet: bool


TASKS = {
    "tiny200": Task("tiny200", "tiny-imagenet-200, 200 classes x 20 labels", True),
    "tiny10": Task("tiny10", "tiny-imagenet, the 10 classes of issue 41 x 20 labels", True),
    "fashion10": Task("fashion10", "Fashion-MNIST, 10 classes x 10 labels", False),
    "fashion50": Task("fashion50", "Fashion-MNIST, 10 classes x 50 labels", False),
    "fashion500": Task("fashion500", "Fashion-MNIST, 10 classes x 500 labels", False),
}


def task_folder(task: str, data: Path, work: Path, val_per_class: int, smoke: bool) -> tuple[Path, list[str]]:
    """The task's ImageFolder and the recipe values that read it."""
    if task.startswith("tiny"):
        root = data / "tiny-imagenet-200"
        wnids = sorted((root / "wnids.txt").read_text().split()) if task == "tiny200" else TINY10
        return tiny_folder(root, work, wnids[:3] if smoke else wnids, val_per_class), []
    labels = 3 if smoke else int(task[len("fashion"):])
    return fashion_folder(data / "fashion-mnist", work, labels, val_per_class), [f"data.train_split=train{labels}"]


# ----------------------------------------------------------------------------------------- runs


def run_arm(task: str, model: str, arm: Arm, folder: Path, reads: list[str], args: argparse.Namespace) -> dict[str, Any]:
    top1, top5, walls, zero = [], [], [], []
    if arm.recipe_only:
        sets = [*MODELS[model][:2], f"data.root={folder}", *reads, *arm.sets, *args.set]
    else:
        sets = [*COMMON, *MODELS[model], f"data.root={folder}", *reads, f"train.epochs={args.epochs}",
                f"optim.lr={args.lr}", *[s.format(epochs=args.epochs) for s in arm.sets], *args.set]
    for seed in range(args.seeds):
        summary = train([*sets, f"train.seed={seed}"], args.work / "runs" / task / model / arm.name)
        rows = [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
        kept = next(row for row in rows if row["epoch"] == summary.get("model_epoch", rows[-1]["epoch"]))
        top1.append(kept["val_top1"])
        top5.append(kept.get("val_top5", float("nan")))
        walls.append(summary["wall_s"])
        zero.append(rows[0]["val_top1"] if rows[0]["epoch"] == 0 else float("nan"))
        print(f"{task} {model} {arm.name} seed {seed}: top-1 {top1[-1]:.3f} ({summary['status']}) in {walls[-1]:.0f} s; "
              f"epochs {[round(r['val_top1'], 3) for r in rows]}", flush=True)
    command = shlex.join(["inceptionlab", "train", "inception_v3/imagefolder",
                          *[x for s in [*sets, "train.seed=SEED"] for x in ("--set", s)]])
    return {"task": task, "model": model, "arm": arm.name, "what": arm.what, "n": len(top1),
            "epochs": int(last_value(sets, "train.epochs")), "lr": float(last_value(sets, "optim.lr")),
            "top1": describe(top1), "top5": describe(top5), "wall_s": statistics.mean(walls),
            "seeds_top1": top1, "start_top1": zero[0], "seen_by_imagenet": TASKS[task].seen_by_imagenet,
            "val_per_class": args.val_per_class, "command": command}


def last_value(sets: list[str], key: str) -> str:
    """The value a run gets for KEY: the last --set naming it wins, as in the CLI."""
    return [s.split("=", 1)[1] for s in sets if s.startswith(key + "=")][-1]


def zero_shot_row(probe: dict[str, Any]) -> dict[str, Any]:
    """The probe's epoch 0: the carried rows of the pretrained head, before any step (same for every seed)."""
    return {**probe, "arm": "zero_shot", "what": "zero-shot: the pretrained head's rows carried by wnid, no step",
            "n": 1, "top1": f"{probe['start_top1']:.3f}", "top5": None, "wall_s": None, "seeds_top1": [probe["start_top1"]]}


COLUMNS = [("task", "task"), ("val_per_class", "val images per class"), ("model", "model"), ("arm", "arm"), ("epochs", "epochs"), ("lr", "lr"), ("n", "seeds"),
           ("top1", "val top-1, mean +- std"), ("wall_s", "s per run", ".0f"), ("seen_by_imagenet", "ImageNet saw these classes")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("INCEPTIONLAB_SHARED_DATA", "../shared/data")))
    parser.add_argument("--work", type=Path, default=None, help="folders and runs (default: $INCEPTIONLAB_CACHE/transfer_real)")
    parser.add_argument("--tasks", default="tiny200")
    parser.add_argument("--models", default="inception,lite0")
    parser.add_argument("--arms", default="probe")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--val-per-class", type=int, default=50, help="validation images per class (tiny: at most 50)")
    parser.add_argument("--folder", type=Path, default=None,
                        help="the (single) task's ImageFolder instead of the one built in --work (a folder whose "
                             "cached features exist: the cache is keyed by the files' paths)")
    parser.add_argument("--set", action="append", default=[], help="a recipe value added to every run")
    parser.add_argument("--smoke", action="store_true", help="3 classes, 1 seed, 1 epoch: the code paths, not a result")
    parser.add_argument("--name", default="transfer_real", help="the result's benchmark name")
    parser.add_argument("--combine", type=Path, nargs="+", default=None,
                        help="result files of earlier parts (each a --name of its own): one transfer_real file of "
                             "their rows, their commands and environments kept in it")
    args = parser.parse_args()
    if args.combine:
        combine(args.combine)
        return
    from inceptionlab import hardware

    if args.smoke:
        args.seeds, args.epochs, args.val_per_class = 1, 3, 2
    args.work = args.work or hardware.cache_root() / "transfer_real"
    start, rows = time.perf_counter(), []
    for task in args.tasks.split(","):
        folder, reads = task_folder(task, args.data, args.work, args.val_per_class, args.smoke)
        folder = args.folder or folder
        for model in args.models.split(","):
            for arm in args.arms.split(","):
                row = run_arm(task, model, ARMS[arm], folder, reads, args)
                if arm == "probe" and model == "lite0" and task.startswith("tiny"):
                    rows.append(zero_shot_row(row))
                rows.append(row)
    title = (f"Fine-tuning from real ImageNet weights: tasks {args.tasks}, {args.val_per_class} validation images "
             f"per class, {args.epochs} epochs, lr {args.lr}" + (" (smoke settings: not a result)" if args.smoke else ""))
    write_result(args.name, rows, title=title, columns=COLUMNS,
                 settings={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                 details={"seconds": time.perf_counter() - start, "uptime": os.getloadavg()})


# Values a part may add that change no accuracy (speed settings, the same input written another way) and so
# stay out of its rows' arm labels.
SAME_RESULT = ("data.loader", "data.num_workers", "data.train_crop_size", "data.val_", "data.interpolation", "data.mean",
               "data.std", "train.precision", "train.channels_last", "train.compile", "model.aux_loss_weight")


def arm_label_extra(part: dict[str, Any]) -> str:
    """What a part's --set values change, for its rows' arm label: " (finetune.bn=train, optim.lr=0.05)"."""
    sets = [s for s in part.get("settings", {}).get("set") or [] if not s.startswith(SAME_RESULT)]
    if not sets and "finetune.bn=train" in part["command"]:  # the part that ran it before --set was recorded
        sets = ["finetune.bn=train"]
    return f" ({', '.join(sets)})" if sets else ""


def combine(paths: list[Path]) -> None:
    """One result of several parts run apart (a 2-core machine runs them one after the other as time allows)."""
    parts = [json.loads(path.read_text()) for path in paths]
    rows, seen = [], set()
    for part in parts:
        extra = arm_label_extra(part)
        for row in part["rows"]:
            key = (row["task"], row["model"], row["arm"]) if row["arm"] == "zero_shot" else None
            if key is not None and key in seen:  # the probe's epoch 0: the same for every rate
                continue
            seen.add(key)
            rows.append({"val_per_class": part["settings"].get("val_per_class"), **row, "arm": row["arm"] + extra,
                         "part": part["benchmark"]})
    title = ("Fine-tuning from real ImageNet weights, validation top-1 (tiny-imagenet: classes ImageNet has seen, "
             "20 labels per class; Fashion-MNIST: unseen); each part's command and settings are in the file")
    write_result("transfer_real", rows, title=title, columns=COLUMNS, settings={"parts": [str(p) for p in paths]},
                 env=parts[-1]["env"], details={"parts": [{k: part[k] for k in ("benchmark", "command", "settings",
                                                                                   "env")} for part in parts]})


if __name__ == "__main__":
    main()
