"""Two processes under torchrun on the CPU (gloo): DDP training, unpadded evaluation, rank-0 files."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import make_image_folder

from inceptionlab.infer.evaluate import evaluate_run

SMALL = ["model.name=resnet18", "model.weights=null", "data.train_crop_size=40", "data.val_resize_size=40",
         "data.val_crop_size=40", "data.num_workers=0", "train.batch_size=4", "train.epochs=2", "optim.lr=0.01"]


def test_two_process_ddp_training_counts_every_val_image_once(tmp_path):
    data = make_image_folder(tmp_path / "data", train_per_class=5, val_per_class=3)
    (data / "val" / "fox" / "fox_2.png").unlink()  # 8 val images... make it odd:
    (data / "val" / "dog" / "dog_2.png").unlink()  # 7 val images: 4 + 3 across two ranks, no padding
    out = tmp_path / "runs"
    sets = [x for item in SMALL for x in ("--set", item)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "inceptionlab", "train", "inception_v3/imagefolder", "--data", str(data), "--out", str(out),
           "--no-progress", "--json", *sets]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]

    runs = list(out.glob("inception_v3/imagefolder/*"))
    assert len(runs) == 1, "only rank 0 creates a run directory"
    json_lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(json_lines) == 1, "only rank 0 prints the summary"
    rows = [json.loads(line) for line in (runs[0] / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2]
    assert all(r["val_samples"] == 7 for r in rows), "padded val shards would count 8"
    assert all(r["samples"] == 16 for r in rows)  # 15 train images padded to 2 x 8

    # The all-reduced DDP metrics equal a single-process evaluation of the saved model.
    single = evaluate_run(runs[0], None, None, device=__import__("torch").device("cpu"), batch_size=3, num_workers=0)
    assert single.result["samples"] == 7
    assert single.result["loss"] == pytest.approx(rows[-1]["val_loss"], rel=1e-4, abs=1e-5)
    assert single.result["top1"] == pytest.approx(rows[-1]["val_top1"])
