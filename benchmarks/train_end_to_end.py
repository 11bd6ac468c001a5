"""End-to-end training images/s of the `inceptionlab train` command on the real tiny-imagenet files.

Two rows, measured in one run: the guide's loop (fp32, NCHW, `data.loader=workers`: PIL decode and
RandomResizedCrop per image in `--workers` processes) and this engine's `auto` speed settings (decided
on this machine: probe, then a timed calibration; `data.loader=resident`: a uint8 cache augmented on the
device), both Inception v3 at
299 px, batch `--batch`, random weights (no ImageNet weights here; the arithmetic is the same).
Each row trains `--epochs` epochs of `--samples` images through the CLI in a fresh process and
reports the last epoch's images/s from metrics.jsonl (the first epoch pays oneDNN's kernel creation
and, for `resident`, the cache build). With `--json`, each row is printed as `{"row": ...}` when it
finishes, then all of them.

    python benchmarks/train_end_to_end.py [--data ../shared/data/tiny-imagenet-200] [--samples 256]
        [--batch 32] [--epochs 2] [--workers 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _results import write_result  # this folder's sibling modules
from data_throughput import copy_dataset

ROWS = {
    "guide": ["train.precision=fp32", "train.channels_last=false", "data.loader=workers"],
    "auto": ["train.precision=auto", "train.channels_last=auto", "train.compile=auto", "data.loader=resident"],
}


def train_row(data: Path, out: Path, overrides: list[str], args: argparse.Namespace) -> dict:
    sets = [*overrides, "model.weights=null", f"train.epochs={args.epochs}", f"train.batch_size={args.batch}",
            f"data.max_train_samples={args.samples}", f"data.max_val_samples={args.batch}",
            f"data.num_workers={args.workers}", "train.log_every=1000"]
    cmd = [sys.executable, "-m", "inceptionlab", "train", "inception_v3/tiny_imagenet", "--data", str(data),
           "--out", str(out), "--no-progress", "--json", *[x for s in sets for x in ("--set", s)]]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    run_dir = Path(json.loads(proc.stdout.strip().splitlines()[-1])["run_dir"])
    epochs = [row for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
              if row["epoch"] > 0]  # epoch 0 (a run from weights): the start's validation, no training
    run_env = json.loads((run_dir / "env.json").read_text())
    return {"images_per_s": epochs[-1]["images_per_s"], "first_epoch_images_per_s": epochs[0]["images_per_s"],
            "command": " ".join(cmd[1:]), "heap": run_env.get("heap")}  # the command's own, not this script's


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "data"
                        / "tiny-imagenet-200")
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = copy_dataset(args.data, Path(tmp))  # the shared copy is read-only
        for name, overrides in ROWS.items():
            rows[name] = row = {"config": name, "overrides": " ".join(overrides),
                                **train_row(data, Path(tmp) / "runs", overrides, args)}
            row["vs_guide"] = round(row["images_per_s"] / rows["guide"]["images_per_s"], 2)  # the guide runs first
            if args.json:  # each row as it finishes: a caller that stops this script keeps the rows done
                print(json.dumps({"row": row}), flush=True)
    write_result("train_end_to_end", list(rows.values()), settings={k: str(v) for k, v in vars(args).items()},
                 title=f"`inceptionlab train` on {args.samples} tiny-imagenet images, Inception v3 at 299 px, "
                       f"batch {args.batch}, last of {args.epochs} epochs",
                 columns=[("config", "configuration"), ("overrides", "settings"),
                          ("images_per_s", "img/s", ".2f"), ("vs_guide", "vs the guide's loop", ".2f"),
                          ("first_epoch_images_per_s", "first epoch img/s", ".2f")])
    if args.json:
        print(json.dumps({"rows": rows}, indent=2))
        return
    for name, row in rows.items():
        print(f"{name:<6} {row['images_per_s']:8.2f} img/s (last epoch)  {row['vs_guide']:5.2f}x  "
              f"first epoch {row['first_epoch_images_per_s']:.2f} img/s")


if __name__ == "__main__":
    main()
