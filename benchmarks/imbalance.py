"""Class imbalance on real data: per-class recall with and without class weights or the balanced sampler.

A long-tailed subset of tiny-imagenet: set B's first classes (benchmarks/transfer.py's split) keep from
all 20 of their training images down to 2, geometrically (class k of C keeps 20 x 0.1^(k/(C-1))), and
are scored on a balanced validation set (the same number of images per class). The model starts
from transfer.py's backbone pretrained on set A (cached; built first if missing) and is fine-tuned with
transfer.py's new schedule. Arms: plain, class weights `auto` (power 1 and 0.5), the balanced sampler.
Reported per arm over seeds: mean recall (= top-1 on the balanced validation set), mean recall of the
most and of the least frequent fifth of the classes; the per-class recall of every seed is in the file.

    python benchmarks/imbalance.py                 # ~15 min on 2 cores with the backbone cached
    python benchmarks/imbalance.py --smoke
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import time
from pathlib import Path

import transfer  # this folder's sibling module: the class split, the links, the backbone, the common settings
from _results import write_result

ARMS = {
    "plain": (),
    "weights_auto": ("train.class_weights=auto", "train.class_weight_power=1.0"),
    "weights_auto_sqrt": ("train.class_weights=auto", "train.class_weight_power=0.5"),
    "balanced_sampler": ("data.sampler=balanced",),
}


def long_tail_folder(root: Path, work: Path, classes: int, val_per_class: int) -> tuple[Path, list[str], list[int]]:
    _, set_b = transfer.class_sets(root)
    chosen = set_b[:classes]
    counts = [max(2, round(20 * 0.1 ** (k / max(1, classes - 1)))) for k in range(classes)]
    val = transfer.val_images(root)
    folder = work / f"longtail-B{classes}-{val_per_class}val"
    transfer.link_folder(folder / "train", {w: transfer.train_images(root, w)[:n] for w, n in zip(chosen, counts)})
    transfer.link_folder(folder / "val", {w: val[w][:val_per_class] for w in chosen})
    return folder, chosen, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("INCEPTIONLAB_SHARED_DATA", "../shared/data")))
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--classes", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=None, help=f"default {transfer.FULL.epochs}")
    parser.add_argument("--pretrain-epochs", type=int, default=None,
                        help=f"the cached backbone's epochs (default {transfer.FULL.pretrain_epochs}, as transfer.py's)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    from inceptionlab import hardware

    settings = transfer.SMOKE if args.smoke else transfer.FULL
    chosen = {"epochs": args.epochs, "pretrain_epochs": args.pretrain_epochs}
    settings = transfer.Settings(**{**settings.__dict__, **{k: v for k, v in chosen.items() if v}})
    classes = 4 if args.smoke else args.classes
    seeds = 1 if args.smoke else args.seeds
    val_per_class = 3 if args.smoke else 30
    work = args.work or hardware.cache_root() / "transfer"
    work.mkdir(parents=True, exist_ok=True)
    root = transfer.tiny_imagenet(args.data)
    pretrain, _ = transfer.build_task_folders(root, work, settings)
    weights = transfer.pretrained_backbone(pretrain, work, settings)
    folder, wnids, counts = long_tail_folder(root, work, classes, val_per_class)
    fifth = max(1, classes // 5)
    task = [*transfer.COMMON, *transfer.NEW, f"data.root={folder}", f"model.weights={weights}",
            f"train.epochs={settings.epochs}", f"train.batch_size={settings.batch}", f"optim.lr={settings.lr}",
            "data.hflip=true"]
    rows, per_class, start = [], {}, time.perf_counter()
    for arm, sets in ARMS.items():
        recalls, frequent, rare = [], [], []
        for seed in range(seeds):
            summary = transfer.train([*task, *sets, f"train.seed={seed}"], work / "imbalance-runs" / arm)
            recall = [summary["last"]["per_class"][w] for w in wnids]
            per_class.setdefault(arm, []).append(recall)
            recalls.append(statistics.mean(recall))
            frequent.append(statistics.mean(recall[:fifth]))
            rare.append(statistics.mean(recall[-fifth:]))
            print(f"{arm} seed {seed}: mean recall {recalls[-1]:.3f}, frequent {frequent[-1]:.3f}, "
                  f"rare {rare[-1]:.3f}", flush=True)
        command = shlex.join(["inceptionlab", "train", "inception_v3/imagefolder",
                              *[x for s in [*task, *sets, "train.seed=SEED"] for x in ("--set", s)]])
        rows.append({"arm": arm, "sets": " ".join(sets) or "-", "n": seeds, "recall": transfer.describe(recalls),
                     "frequent": transfer.describe(frequent), "rare": transfer.describe(rare), "command": command})
    write_result("imbalance", rows,
                 title=(f"Long-tailed tiny-imagenet subset: {classes} classes with {counts[0]} down to {counts[-1]} "
                        f"training images, {val_per_class} validation images each; recall = top-1 on the balanced "
                        f"validation set; frequent / rare = the {fifth} most / least frequent classes"
                        + (" (smoke settings: not a result)" if args.smoke else "")),
                 columns=[("arm", "arm"), ("sets", "recipe overrides"), ("n", "seeds"),
                          ("recall", "mean recall, mean +- std"), ("frequent", "frequent classes' recall"),
                          ("rare", "rare classes' recall")],
                 settings={"classes": classes, "counts": counts, "val_per_class": val_per_class, "seeds": seeds,
                           "smoke": args.smoke, **settings.__dict__},
                 details={"per_class_recall": per_class, "classes": wnids, "seconds": time.perf_counter() - start})


if __name__ == "__main__":
    main()
