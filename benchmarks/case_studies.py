"""Wall time and accuracy of the guide's small case studies, the whole `inceptionlab train` command.

For each recipe and seed: run the CLI in a fresh process (start-up, data reading, training, test,
plots and export all counted, like timing the guide's whole Keras script), read the run's summary.
Prints mean +- std over seeds with n and writes them as a result file. Also compares the two loaders
on Fashion-MNIST (`--loaders`). The guide's own Keras code for IMDB is timed on the same machine by
`benchmarks/guide_keras_imdb.py`.

    python benchmarks/case_studies.py [--seeds 3] [--data ../shared/data] [--only fashion_mnist,imdb,cifar10,demo]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import write_result  # this folder's sibling module

CASES = {
    # name: (recipe, data folder under --data, extra overrides)
    "fashion_mnist": ("fashion_mnist/mlp", "fashion-mnist", []),
    "imdb": ("imdb/text_classifier", "imdb/aclImdb_labeled.tar.gz", []),
    "cifar10": ("cifar10/small_cnn", "cifar-10", []),
    # `make demo`'s command itself (embedded digits, written under --out): the README's demo row
    "demo": ("demo/digits", None, []),
}


def run_once(recipe: str, data: Path | None, seed: int, extra: list[str], out: Path) -> dict:
    overrides = ["--set", f"train.seed={seed}", *[x for e in extra for x in ("--set", e)]]
    if data is None:  # the demo: its own command, data made under --out, the summary in the run directory
        out = out / f"demo-{seed}"
        cmd = [sys.executable, "-m", "inceptionlab", "demo", "--out", str(out), "--data", str(out / "digits"),
               "--no-progress", *overrides]
    else:
        cmd = [sys.executable, "-m", "inceptionlab", "train", recipe, "--data", str(data), "--out", str(out),
               "--no-progress", "--json", *overrides]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    if data is None:
        summary = json.loads(next(out.glob("demo/digits/*/summary.json")).read_text())
    else:
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
    scored = summary.get("test") or summary["last"]
    return {"wall_s": wall, "accuracy": scored["top1"], "train_wall_s": summary["wall_seconds"]}


def describe(values: list[float], digits: int) -> str:
    mean = statistics.mean(values)
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.{digits}f} +- {spread:.{digits}f} (n={len(values)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "data")
    parser.add_argument("--only", default="fashion_mnist,imdb")
    parser.add_argument("--loaders", action="store_true", help="also time Fashion-MNIST with data.loader=workers")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            recipe, folder, extra = CASES[name]
            data = None if folder is None else args.data / folder
            variants = [("auto", extra)]
            if args.loaders and name == "fashion_mnist":
                variants.append(("workers (2 processes)", [*extra, "data.loader=workers", "data.num_workers=2"]))
            for label, overrides in variants:
                runs = [run_once(recipe, data, seed, overrides, Path(tmp)) for seed in range(args.seeds)]
                results.append({"recipe": recipe, "loader": label, "n": len(runs),
                                "accuracy": describe([r["accuracy"] for r in runs], 4),
                                "wall_s": describe([r["wall_s"] for r in runs], 1), "runs": runs})
                print(f"{name:<14} {label:<22} accuracy {results[-1]['accuracy']}  wall {results[-1]['wall_s']} s",
                      flush=True)
    write_result("case_studies", results, settings={k: str(v) for k, v in vars(args).items()},
                 title="The guide's case studies and the demo: the whole `inceptionlab train` (`demo`) command, full data",
                 columns=[("recipe", "recipe"), ("loader", "data.loader"), ("n", "seeds"),
                          ("accuracy", "test (demo: validation) accuracy, mean +- std"), ("wall_s", "whole command s, mean +- std")])


if __name__ == "__main__":
    main()
