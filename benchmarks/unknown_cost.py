"""The kNN unknown detector's cost per request in `serve` at batch 1, against the model's own time.

On the tiny-imagenet probe that benchmarks/unknown.py trains (the real Inception v3 body at 299 px,
eager PyTorch fp32, one instance): a served request under the kNN rule (the features out of the model
and the search of its bank) and under the softmax rule alone (the same run without its detector), in
interleaved rounds; the rule's own decide() with and without the features; and the search against a
bank of the largest size a run keeps (models/knn.py MAX_BANK_BYTES).

    python benchmarks/unknown.py --models tiny --no-cost   # trains the probe once (under --work)
    python benchmarks/unknown_cost.py [--rounds 40]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from _results import write_result  # this folder's sibling module

ROOT = Path(__file__).resolve().parents[1]


def serve_cost(run: Path, rounds: int) -> list[dict[str, Any]]:
    """Per-request time at batch 1 in serve's ServedModel (eager PyTorch, fp32): the kNN rule's (features
    out of the model and the bank search) against the softmax rule's, interleaved; and the search alone
    against a bank of the largest size a run keeps."""
    import torch

    from inceptionlab.models.knn import MAX_BANK_BYTES, kth_distance, normalised
    from inceptionlab.serve.models import ModelLoadSettings, load_served_model

    from inceptionlab.models.spec import ModelSpec

    def served(run_dir: Path):
        settings = ModelLoadSettings(backend="eager", precision="fp32", device="cpu", max_batch=1, instances=1,
                                     log=lambda m: None)
        return load_served_model(settings, run_dir=run_dir, name="m")

    # The same run with the softmax rule alone (its spec.json without the kNN detector): the engine then
    # runs the bare model, as every run without a bank does.
    bare = run.parent / (run.name + "-softmax-only")
    if not bare.exists():
        shutil.copytree(run, bare, ignore=shutil.ignore_patterns("checkpoints", "tb", "eval", "exports"))
    spec = ModelSpec.load(bare / "spec.json")
    spec.rule = spec.rule.softmax_only()
    spec.save(bare / "spec.json")
    with_knn, plain = served(run), served(bare)
    assert with_knn.feature_dim and not plain.feature_dim
    image = np.random.default_rng(0).normal(size=(1, *with_knn.input_shape)).astype(np.float32)
    times: dict[str, list[float]] = {"softmax rule": [], "kNN rule": []}
    for _ in range(3):
        plain.run(0, [image]), with_knn.run(0, [image])
    for _ in range(rounds):
        for label, model in (("softmax rule", plain), ("kNN rule", with_knn)):
            start = time.perf_counter()
            model.run(0, [image])
            times[label].append((time.perf_counter() - start) * 1e3)
    base = float(np.median(times["softmax rule"]))
    rows = []
    for label, values in times.items():
        median = float(np.median(values))
        rows.append({"what": f"served request, {label}", "bank": with_knn.rule.knn.describe() if label == "kNN rule"
                     else "-", "median_ms": median, "min_ms": float(np.min(values)),
                     "added_ms": median - base, "added_share": (median - base) / base})
    # The rule's own work, apart from the model (less exposed to the machine's load than two forward passes
    # whose difference it is): decide() with the features against decide() on the logits alone.
    out = with_knn.engines[0].run(with_knn._batch_input([image]))
    logits, features = out[:, :-with_knn.feature_dim], out[:, -with_knn.feature_dim:]
    decide = {"softmax": lambda: with_knn.rule.softmax_only().decide(logits),
              "knn": lambda: with_knn.rule.decide(logits, features)}
    spent: dict[str, list[float]] = {"softmax": [], "knn": []}
    for _ in range(10 * rounds):
        for label, call in decide.items():
            start = time.perf_counter()
            call()
            spent[label].append((time.perf_counter() - start) * 1e3)
    added = float(np.median(spent["knn"]) - np.median(spent["softmax"]))
    rows.append({"what": "the kNN rule's decide() beyond the softmax rule's", "bank": f"{with_knn.rule.knn.rows} x "
                 f"{with_knn.rule.knn.dim}, k {with_knn.rule.knn.k}", "median_ms": added,
                 "min_ms": float(np.min(spent["knn"]) - np.min(spent["softmax"])), "added_ms": added,
                 "added_share": added / base})
    dim = with_knn.rule.knn.dim
    big = normalised(torch.randn(MAX_BANK_BYTES // (4 * dim), dim))
    query = torch.randn(1, dim)
    for _ in range(3):
        kth_distance(query, big, 50)
    search = []
    for _ in range(rounds):
        start = time.perf_counter()
        kth_distance(query, big, 50)
        search.append((time.perf_counter() - start) * 1e3)
    median = float(np.median(search))
    rows.append({"what": "search alone, largest bank", "bank": f"{len(big):,} x {dim} (MAX_BANK_BYTES), k 50",
                 "median_ms": median, "min_ms": float(np.min(search)), "added_ms": median,
                 "added_share": median / base})
    return rows


def write_cost(cost: list[dict[str, Any]], args: argparse.Namespace) -> None:
    for row in cost:
        print(f"serve batch 1: {row['what']}: {row['median_ms']:.3f} ms ({row['added_share']:+.2%})", flush=True)
    details = {"uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
               "load_average_at_end": list(os.getloadavg())}
    path = write_result("unknown_cost", cost, title="The kNN rule's cost per request in serve at batch 1 (tiny probe, "
                        "Inception v3 at 299 px, eager fp32, one instance)",
                        columns=[("what", "what"), ("bank", "bank"), ("median_ms", "median ms", ".3f"),
                                 ("min_ms", "min ms", ".3f"), ("added_share", "of the model's time", ".2%")],
                        settings={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                        details=details)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-unknown")
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    runs = sorted((args.work / "runs-tiny").glob("*/*/2*[0-9]/model.pt"))
    if not runs:
        raise SystemExit(f"no tiny probe under {args.work}: run python benchmarks/unknown.py --models tiny first")
    write_cost(serve_cost(runs[-1].parent, args.rounds), args)


if __name__ == "__main__":
    main()
