"""Transfer learning measured here: which fine-tuning method wins on a real transfer task, over seeds.

No ImageNet weights can be had on these machines, so the transfer is built from real data that is:
tiny-imagenet-200's 200 classes are split into two disjoint sets by a fixed permutation. A backbone
(resnet18 at the images' own 64 px) is trained from scratch on set A (train images plus most of A's
validation images) and saved as a plain weights file, the `model.weights=FILE` path users take; it is
cached, keyed by its settings. Then set B's classes are learnt from few labels per class (set B's
training images), starting from that file, and scored on B's validation images, with each method in
ARMS (a table: a row is a name and the recipe overrides it adds to the common ones). Every arm runs for
each seed; the result is mean +- std over seeds with n, per arm.

    python benchmarks/transfer.py                      # ~30 min on 2 cores once A's backbone is cached
    python benchmarks/transfer.py --smoke              # a tiny run of every code path (minutes)
    python benchmarks/transfer.py --arms linear_probe,new_schedule --seeds 5

Arms whose recipe keys a version does not have are reported as not run, with the key that is missing. The result file goes through _results.py
(`transfer--<machine>--<time>.json`) and the docs' fine-tuning page renders it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _results import write_result  # this folder's sibling module

SPLIT_SEED = 2026  # the permutation of the 200 classes into set A (pretraining) and set B (transfer)


@dataclass(frozen=True)
class Arm:
    name: str
    what: str
    sets: tuple[str, ...]


# Each arm's overrides on top of COMMON and the task's own (data, weights, epochs). "One rate": every layer
# at optim.lr, every parameter decayed, no warm-up: the guide's way. "New schedule": the head alone on
# cached features for 2 epochs, then the whole model, warm-up per step, layer-wise decay, no decay on
# norm and bias. The last two rows add the augment section's options (skipped where a version lacks them).
NEW = ("finetune.freeze_epochs=2", "schedule.warmup_epochs=1", "finetune.layer_decay=0.75",
       "optim.decay_norm_and_bias=false")
ARMS = [
    Arm("scratch", "from scratch (random init), one rate", ("model.weights=null", "optim.decay_norm_and_bias=true")),
    Arm("linear_probe", "linear probe: the head alone on the frozen body's features",
        ("finetune.freeze_epochs=1000", "optim.decay_norm_and_bias=false")),
    Arm("one_rate", "full fine-tune, every layer at one rate", ("optim.decay_norm_and_bias=true",)),
    Arm("new_schedule", "head first, then all with warm-up and layer-wise rates", NEW),
    Arm("new_ema", "+ EMA of the weights", (*NEW, "ema.decay=0.998")),
    Arm("new_ema_augment", "+ TrivialAugmentWide", (*NEW, "ema.decay=0.998", "augment.policy=trivialaugment")),
    # The references' alphas (torchvision: mixup 0.2, cutmix 1.0), one of the two per batch.
    Arm("new_ema_augment_mix", "+ MixUp/CutMix", (*NEW, "ema.decay=0.998", "augment.policy=trivialaugment",
                                                 "augment.mixup_alpha=0.2", "augment.cutmix_alpha=1.0")),
]

COMMON = ("model.name=resnet18", "data.train_crop_size=64", "data.val_resize_size=64", "data.val_crop_size=64",
          "data.train_crop_scale=[0.35,1.0]", "data.loader=resident", "data.num_workers=0", "train.precision=fp32",
          "train.channels_last=false", "train.compile=false", "train.log_every=1000", "optim.name=sgd",
          "optim.momentum=0.9", "optim.weight_decay=5e-4", "schedule.name=cosine", "train.label_smoothing=0.1",
          # inception_v3/imagefolder is a linear probe by default; the arms train the body unless they say otherwise
          "finetune.body_lr_mult=1")


@dataclass(frozen=True)
class Settings:
    classes: int  # of set B, learnt from few labels
    labels: int  # training images per class of set B (tiny-imagenet here has 20 per class)
    val_per_class: int  # of set B's 50 validation images per class
    epochs: int
    batch: int
    lr: float
    pretrain_epochs: int
    pretrain_classes: int
    seeds: int


FULL = Settings(classes=100, labels=10, val_per_class=20, epochs=12, batch=32, lr=0.01, pretrain_epochs=30,
                pretrain_classes=100, seeds=3)
SMOKE = Settings(classes=4, labels=3, val_per_class=3, epochs=2, batch=4, lr=0.01, pretrain_epochs=1,
                 pretrain_classes=4, seeds=1)


# ----------------------------------------------------------------------------------------- data


def tiny_imagenet(data: Path) -> Path:
    root = data / "tiny-imagenet-200" if (data / "tiny-imagenet-200").is_dir() else data
    if not (root / "wnids.txt").is_file():
        raise SystemExit(f"{root}: no tiny-imagenet-200 here (wnids.txt); pass --data DIR")
    return root


def class_sets(root: Path) -> tuple[list[str], list[str]]:
    import random

    wnids = sorted((root / "wnids.txt").read_text().split())
    random.Random(SPLIT_SEED).shuffle(wnids)
    half = len(wnids) // 2
    return wnids[:half], wnids[half:]


def train_images(root: Path, wnid: str) -> list[Path]:
    return sorted((root / "train" / wnid / "images").glob("*.JPEG"))


def val_images(root: Path) -> dict[str, list[Path]]:
    by_class: dict[str, list[Path]] = {}
    folder = root / "val"
    if (folder / "val_annotations.txt").is_file():  # the original layout: one folder, a list of labels
        for line in (folder / "val_annotations.txt").read_text().splitlines():
            name, wnid, *_ = line.split("\t")
            by_class.setdefault(wnid, []).append(folder / "images" / name)
    else:  # regrouped by `inceptionlab data tiny-imagenet`
        for sub in folder.iterdir():
            if sub.is_dir():
                by_class[sub.name] = sorted(p for p in sub.rglob("*.JPEG"))
    return {wnid: sorted(paths) for wnid, paths in by_class.items()}


def link_folder(target: Path, files: dict[str, list[Path]]) -> Path:
    """An ImageFolder split of symbolic links (nothing is copied); rebuilt only when its listing differs."""
    listing = hashlib.sha256(json.dumps({k: [str(p) for p in v] for k, v in sorted(files.items())}).encode()).hexdigest()
    stamp = target / ".listing"
    if stamp.is_file() and stamp.read_text() == listing:
        return target
    for wnid, paths in files.items():
        folder = target / wnid
        folder.mkdir(parents=True, exist_ok=True)
        for path in paths:
            link = folder / path.name
            if not link.exists():
                link.symlink_to(path.resolve())
    stamp.write_text(listing)
    return target


def build_task_folders(root: Path, work: Path, settings: Settings) -> tuple[Path, Path]:
    """(pretraining ImageFolder of set A, transfer ImageFolder of set B), both with train/ and val/."""
    set_a, set_b = class_sets(root)
    val = val_images(root)
    a = set_a[: settings.pretrain_classes]
    b = set_b[: settings.classes]
    pretrain = work / f"pretrain-A{len(a)}"
    # Set A: its 20 training images and 40 of its 50 validation images train; the other 10 validate.
    link_folder(pretrain / "train", {w: train_images(root, w) + val[w][:40] for w in a})
    link_folder(pretrain / "val", {w: val[w][40:] for w in a})
    transfer = work / f"transfer-B{len(b)}-{settings.labels}labels-{settings.val_per_class}val"
    link_folder(transfer / "train", {w: train_images(root, w)[: settings.labels] for w in b})
    link_folder(transfer / "val", {w: val[w][: settings.val_per_class] for w in b})
    return pretrain, transfer


# ----------------------------------------------------------------------------------------- runs


def train(recipe_sets: list[str], out: Path) -> dict[str, Any]:
    from inceptionlab.engine.choices import load_training_recipe
    from inceptionlab.engine.fit import fit

    recipe = load_training_recipe("inception_v3/imagefolder", recipe_sets)
    start = time.perf_counter()
    outcome = fit(recipe, out, progress=False)
    return {**outcome.summary, "run_dir": str(outcome.run_dir), "wall_s": time.perf_counter() - start}


def pretrained_backbone(folder: Path, work: Path, settings: Settings) -> Path:
    """A resnet18 trained from scratch on set A, as a plain state_dict file; cached by its settings."""
    from inceptionlab.fileio import atomic_write_bytes

    sets = [*COMMON, f"data.root={folder}", "model.weights=null", f"train.epochs={settings.pretrain_epochs}",
            "train.batch_size=64", "optim.lr=0.1", "schedule.warmup_epochs=1", "data.hflip=true",
            "optim.decay_norm_and_bias=false"]
    key = hashlib.sha256(json.dumps(sets).encode()).hexdigest()[:12]
    weights = work / f"resnet18-setA-{key}.pt"
    if weights.is_file():
        print(f"pretrained backbone: {weights} (cached)", flush=True)
        return weights
    print(f"pretraining resnet18 on set A ({folder}), {settings.pretrain_epochs} epochs ...", flush=True)
    summary = train(sets, work / "pretrain-runs")
    # A cache checked by its existence: written whole or not at all (44 MB, read once).
    atomic_write_bytes(weights, (Path(summary["run_dir"]) / "model.pt").read_bytes())
    (work / f"resnet18-setA-{key}.json").write_text(json.dumps({"sets": sets, "summary": summary}, default=str))
    print(f"pretrained backbone: {weights} (val top-1 on set A {summary['last']['top1']:.3f}, "
          f"{summary['wall_s']:.0f} s)", flush=True)
    return weights


def arm_available(arm: Arm) -> str | None:
    """None when this version has every key the arm sets, else the first missing key."""
    from inceptionlab.config import load_recipe
    from inceptionlab.errors import UserError

    try:
        load_recipe("inception_v3/imagefolder", list(arm.sets))
    except UserError as exc:
        return str(exc).split("`")[1] if "`" in str(exc) else str(exc)
    return None


def describe(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} +- {spread:.3f}"


def run_arms(arms: list[Arm], folder: Path, weights: Path, settings: Settings, work: Path) -> list[dict[str, Any]]:
    rows = []
    task = [f"data.root={folder}", f"model.weights={weights}", f"train.epochs={settings.epochs}",
            f"train.batch_size={settings.batch}", f"optim.lr={settings.lr}", "data.hflip=true"]
    for arm in arms:
        missing = arm_available(arm)
        if missing:
            rows.append({"arm": arm.name, "what": arm.what, "n": 0, "top1": f"not run: no `{missing}` in this version"})
            print(f"{arm.name}: not run (no {missing})", flush=True)
            continue
        top1, top5, walls = [], [], []
        for seed in range(settings.seeds):
            sets = [*COMMON, *task, *arm.sets, f"train.seed={seed}"]
            summary = train(sets, work / "transfer-runs" / arm.name)
            top1.append(summary["last"]["top1"])
            top5.append(summary["last"].get("top5", float("nan")))
            walls.append(summary["wall_s"])
            print(f"{arm.name} seed {seed}: top-1 {top1[-1]:.3f} in {walls[-1]:.0f} s", flush=True)
        command = shlex.join(["inceptionlab", "train", "inception_v3/imagefolder",
                              *[x for s in [*COMMON, *task, *arm.sets, "train.seed=SEED"] for x in ("--set", s)]])
        rows.append({"arm": arm.name, "what": arm.what, "n": len(top1), "top1": describe(top1), "top5": describe(top5),
                     "wall_s": statistics.mean(walls), "seeds_top1": top1, "command": command})
    return rows


COLUMNS = [("arm", "arm"), ("what", "method"), ("n", "seeds"), ("top1", "top-1, mean +- std"),
           ("top5", "top-5, mean +- std"), ("wall_s", "s per run", ".0f")]


@dataclass(frozen=True)
class Task:
    """The task as the command line set it: settings, the arms chosen, set B's folder and the backbone."""

    settings: Settings
    arms: list[Arm]
    folder: Path
    weights: Path
    work: Path
    smoke: bool

    def title(self) -> str:
        s = self.settings
        return (f"Transfer to {s.classes} new tiny-imagenet classes from {s.labels} labels each (resnet18 "
                f"pretrained on {s.pretrain_classes} other classes), validation top-1 over {s.val_per_class} "
                f"images per class, {s.epochs} epochs" + (" (smoke settings: not a result)" if self.smoke else ""))


def task_parser(description: str, default_arms: str) -> argparse.ArgumentParser:
    """The options of this script and of transfer_lr.py: the data, the task's size, the arms."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("INCEPTIONLAB_SHARED_DATA", "../shared/data")),
                        help="folder holding tiny-imagenet-200 (default: $INCEPTIONLAB_SHARED_DATA)")
    parser.add_argument("--work", type=Path, default=None, help="links, runs and the cached backbone "
                        "(default: $INCEPTIONLAB_CACHE/transfer)")
    parser.add_argument("--arms", default=default_arms, help="comma-separated arm names")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--classes", type=int, default=None, help=f"classes of set B (default {FULL.classes})")
    parser.add_argument("--epochs", type=int, default=None, help=f"fine-tuning epochs per run (default {FULL.epochs})")
    parser.add_argument("--pretrain-epochs", type=int, default=None,
                        help=f"the backbone's epochs on set A (default {FULL.pretrain_epochs}; cached per value)")
    parser.add_argument("--val-per-class", type=int, default=None,
                        help=f"set B's validation images per class (default {FULL.val_per_class}, at most 50)")
    parser.add_argument("--smoke", action="store_true", help="tiny settings: every code path in minutes")
    return parser


def prepare_task(args: argparse.Namespace) -> Task:
    """Settings from the options, the task's folders linked, the backbone trained or recalled."""
    from inceptionlab import hardware

    settings = SMOKE if args.smoke else FULL
    chosen_settings = {"seeds": args.seeds, "classes": args.classes, "epochs": args.epochs,
                       "pretrain_epochs": args.pretrain_epochs, "val_per_class": args.val_per_class}
    settings = Settings(**{**settings.__dict__, **{k: v for k, v in chosen_settings.items() if v}})
    work = args.work or hardware.cache_root() / "transfer"
    work.mkdir(parents=True, exist_ok=True)
    root = tiny_imagenet(args.data)
    pretrain, folder = build_task_folders(root, work, settings)
    weights = pretrained_backbone(pretrain, work, settings)
    return Task(settings, [a for a in ARMS if a.name in args.arms.split(",")], folder, weights, work, args.smoke)


def main() -> None:
    args = task_parser(__doc__.splitlines()[0], ",".join(a.name for a in ARMS)).parse_args()
    start = time.perf_counter()
    task = prepare_task(args)
    rows = run_arms(task.arms, task.folder, task.weights, task.settings, task.work)
    write_result("transfer", rows, title=task.title(), settings={**task.settings.__dict__, "smoke": task.smoke},
                 columns=COLUMNS, details={"seconds": time.perf_counter() - start, "backbone": str(task.weights)})


if __name__ == "__main__":
    main()
