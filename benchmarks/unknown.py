"""Unknown detection measured: the kNN distance against the energy and max-softmax scores, on three models.

For each model, `inceptionlab evaluate RUN --unknown coverage=0.95` fits the kNN detector on the run's own
validation split (the user's command), then `evaluate RUN --keep-rule --unknown-images DIR` scores each
source of images of none of its classes under that rule. Every score is thresholded for 95% of the
validation images answered; the figures are the share of the unknown images still answered (FPR95; lower
is better), AUROC, and the share the saved rule (softmax threshold off, kNN at its threshold) answers
`unknown`.

Models:
- `tiny`: a linear probe on the real Inception v3 body (`model.name=inception_v3_fid`, Google's 2015
  ImageNet weights, converted; cached features), 10 tiny-imagenet classes. ImageNet has seen these
  classes (all 200 tiny-imagenet wnids are ImageNet-1k classes): the body's features were trained on them.
  Unknowns: validation photos of 100 other tiny-imagenet classes (one each), CIFAR-10 photographs,
  uniform noise.
- `fashion`: the guide's Fashion-MNIST MLP (fashion_mnist/mlp). Unknowns: CIFAR-10 photographs
  (the model's preprocessing turns them grey), noise.
- `digits`: the demo's Inception v3 on scikit-learn's digits at 80 px (demo/digits, `make demo`'s recipe).
  Unknowns: CIFAR-10 photographs, noise.

Then the score's cost per request in `serve` at batch 1 on the tiny model (benchmarks/unknown_cost.py;
`--no-cost` leaves it out).

    python benchmarks/unknown.py                     # all three, ~20-30 min on 2 shared cores
    python benchmarks/unknown.py --models tiny --ood 60
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from _results import write_result  # this folder's sibling module
from unknown_cost import serve_cost, write_cost  # this folder's sibling module

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("INCEPTIONLAB_SHARED_DATA", "/work/shared/data"))
WEIGHTS = Path.home() / ".cache/inceptionlab/real-weights/inception_v3_fid.pt"
CLASS_SEED = 42  # which 10 tiny-imagenet classes, and which other classes give the unknown photos


def cli(*args: str, json_out: bool = True) -> Any:
    """`inceptionlab ARGS` in a subprocess (as a user runs it); its JSON when asked."""
    command = [sys.executable, "-m", "inceptionlab", *args, *(["--json"] if json_out else [])]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{done.stderr[-3000:]}")
    if not json_out:
        return done.stdout
    return json.loads(done.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- data


def tiny_folders(work: Path, train_per_class: int, val_per_class: int, ood: int) -> tuple[Path, Path]:
    """An ImageFolder of 10 tiny-imagenet classes (train: the 20 training images of each plus validation
    images up to `train_per_class`; val: the next `val_per_class` validation images), and one photo each
    of `ood` other classes' validation images. Symlinks to the original JPEGs."""
    tiny = SHARED / "tiny-imagenet-200"
    wnids = (tiny / "wnids.txt").read_text().split()
    order = np.random.default_rng(CLASS_SEED).permutation(len(wnids))
    chosen, others = [wnids[i] for i in order[:10]], [wnids[i] for i in order[10:10 + ood]]
    by_class: dict[str, list[Path]] = {}
    for line in (tiny / "val" / "val_annotations.txt").read_text().splitlines():
        name, wnid = line.split("\t")[:2]
        by_class.setdefault(wnid, []).append(tiny / "val" / "images" / name)
    data, outside = work / "tiny10", work / "unknown" / "tiny_other_classes"
    if data.exists():
        return data, outside
    for wnid in chosen:
        train = sorted((tiny / "train" / wnid / "images").glob("*.JPEG"))
        val = sorted(by_class[wnid])
        extra = train_per_class - len(train)
        for split, files in (("train", train + val[:extra]), ("val", val[extra:extra + val_per_class])):
            folder = data / split / wnid
            folder.mkdir(parents=True, exist_ok=True)
            for f in files:
                (folder / f.name).symlink_to(f)
    outside.mkdir(parents=True)
    for wnid in others:
        f = sorted(by_class[wnid])[0]
        (outside / f.name).symlink_to(f)
    return data, outside


def cifar_photos(folder: Path, count: int) -> Path:
    """The first `count` of the 200 CIFAR-10 training photographs here (32 px PNGs, Kaggle's numbering)."""
    if not folder.exists():
        source = SHARED / "cifar-10" / "kaggle_train_first200" / "train"
        folder.mkdir(parents=True)
        for i in range(1, count + 1):
            (folder / f"cifar_{i:04d}.png").symlink_to(source / f"{i}.png")
    return folder


def noise_images(folder: Path, count: int, size: int = 64) -> Path:
    if not folder.exists():
        folder.mkdir(parents=True)
        rng = np.random.default_rng(0)
        for i in range(count):
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"noise_{i:04d}.png")
    return folder


# --------------------------------------------------------------------------- runs


def train(recipe: str, data: Path | None, out: Path, sets: list[str]) -> Path:
    existing = sorted(out.glob("*/*/*/model.pt"))
    if existing:
        return existing[-1].parent
    args = ["train", recipe, "--out", str(out), *[a for s in sets for a in ("--set", s)]]
    if data is not None:
        args += ["--data", str(data)]
    started = time.perf_counter()
    cli(*args, json_out=False)
    run = sorted(out.glob("*/*/*/model.pt"))[-1].parent
    (run / "bench_train_seconds.txt").write_text(f"{time.perf_counter() - started:.1f}\n")
    return run


def measure(name: str, run: Path, unknowns: dict[str, Path], what: str) -> list[dict[str, Any]]:
    fitted = cli("evaluate", str(run), "--unknown", "coverage=0.95", "--num-workers", "0")
    knn = fitted["rule"]["knn"]
    rows = []
    for source, folder in unknowns.items():
        report = cli("evaluate", str(run), "--keep-rule", "--unknown-images", str(folder), "--num-workers", "0")
        outside = report["outside_images"]
        for score, row in outside["scores"].items():
            rows.append({"model": name, "what": what, "unknown_images": source, "images": outside["images"],
                         "score": score, "fpr95": row["fpr95"], "auroc": row["auroc"],
                         "unknown_share": row["unknown_share"], "val_top1": fitted["top1"],
                         "val_images": fitted["samples"], "rule_unknown_share": outside["unknown_share"],
                         "bank": f"{knn['rows']} x {knn['dim']}", "k": knn["k"]})
        print(f"{name} / {source}: " + ", ".join(f"{r['score']} FPR95 {r['fpr95']:.3f} AUROC {r['auroc']:.3f}"
                                               for r in rows if r["unknown_images"] == source), flush=True)
    return rows + without_length_bound(name, run, unknowns, what, rows)


def without_length_bound(name: str, run: Path, unknowns: dict[str, Path], what: str,
                         rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The kNN rows again on the same run and bank with the feature-length bound taken out of spec.json (the
    distance alone, as rules fitted before the bound answer): its effect measured within one run."""
    spec_path = run / "spec.json"
    saved = spec_path.read_text()
    spec = json.loads(saved)
    if spec["rule"]["knn"].pop("norm_range", None) is None:
        return []
    spec_path.write_text(json.dumps(spec, indent=2))
    try:
        extra = []
        for source, folder in unknowns.items():
            report = cli("evaluate", str(run), "--keep-rule", "--unknown-images", str(folder), "--num-workers", "0")
            row = report["outside_images"]["scores"]["knn"]
            like = next(r for r in rows if r["unknown_images"] == source and r["score"] == "knn")
            extra.append({**like, "score": "knn_unbounded", "fpr95": row["fpr95"], "auroc": row["auroc"],
                          "unknown_share": row["unknown_share"]})
            print(f"{name} / {source}: knn without the length bound FPR95 {row['fpr95']:.3f} AUROC {row['auroc']:.3f}",
                  flush=True)
        return extra
    finally:
        spec_path.write_text(saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,fashion,digits")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-unknown")
    parser.add_argument("--ood", type=int, default=100, help="images per unknown source")
    parser.add_argument("--train-per-class", type=int, default=45)
    parser.add_argument("--val-per-class", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--no-cost", action="store_true")
    args = parser.parse_args()
    if not WEIGHTS.is_file() and "tiny" in args.models:
        raise SystemExit(f"{WEIGHTS}: the real Inception weights are not cached (make real-weights)")
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    cifar = cifar_photos(work / "unknown" / "cifar10", args.ood)
    noise = noise_images(work / "unknown" / "noise", args.ood)
    rows, runs, cost = [], {}, []
    seconds = {}
    for name in args.models.split(","):
        started = time.perf_counter()
        if name == "tiny":
            data, others = tiny_folders(work, args.train_per_class, args.val_per_class, args.ood)
            runs[name] = train("inception_v3/imagefolder", data, work / "runs-tiny", [
                "model.name=inception_v3_fid", f"model.weights={WEIGHTS}", "finetune.freeze_epochs=1000",
                "train.epochs=30", "train.batch_size=32", "optim.name=adamw", "optim.lr=0.003",
                "optim.weight_decay=0.0001", "schedule.name=cosine", "schedule.warmup_epochs=0",
                "train.precision=fp32", "train.channels_last=false", "train.compile=false", "data.num_workers=0",
                "train.log_every=1000"])
            unknowns = {"tiny-imagenet, 100 other classes": others, "CIFAR-10 photographs": cifar, "noise": noise}
            what = "linear probe, real Inception v3 body (ImageNet), 10 tiny-imagenet classes"
        elif name == "fashion":
            runs[name] = train("fashion_mnist/mlp", SHARED / "fashion-mnist", work / "runs-fashion",
                               ["train.epochs=5", "train.log_every=100000"])
            unknowns = {"CIFAR-10 photographs (grey)": cifar, "noise": noise}
            what = "the guide's Fashion-MNIST MLP (5 epochs)"
        elif name == "digits":
            runs[name] = train("demo/digits", None, work / "runs-digits", ["train.precision=fp32",
                                                                           "train.channels_last=false",
                                                                           "train.compile=false"])
            unknowns = {"CIFAR-10 photographs": cifar, "noise": noise}
            what = "the demo's Inception v3 on digits at 80 px (make demo's recipe)"
        else:
            raise SystemExit(f"--models: unknown model {name!r}")
        rows += measure(name, runs[name], unknowns, what)
        seconds[name] = round(time.perf_counter() - started, 1)
        if name == "tiny" and not args.no_cost:
            cost = serve_cost(runs[name], args.rounds)
            write_cost(cost, args)
    load = os.getloadavg()
    details = {"runs": {k: str(v) for k, v in runs.items()}, "seconds": seconds,
               "load_average_at_end": list(load), "uptime": subprocess.run(["uptime"], capture_output=True,
                                                                           text=True).stdout.strip(),
               "note": "ImageNet has seen the 10 tiny-imagenet classes (all 200 are ImageNet-1k classes)"}
    path = write_result("unknown", rows, title="Unknown detection: share of images of no class answered at 95% of "
                        "validation answered (FPR95), kNN distance vs energy vs max softmax",
                        columns=[("model", "model"), ("unknown_images", "unknown images"), ("images", "n"),
                                 ("score", "score"), ("fpr95", "FPR95", ".3f"), ("auroc", "AUROC", ".3f"),
                                 ("val_images", "val images"), ("bank", "bank"), ("k", "k")],
                        settings={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                        details=details)
    shutil.rmtree(work / "scratch", ignore_errors=True)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
