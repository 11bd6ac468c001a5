"""CIFAR-10, Fashion-MNIST and MNIST validate on a part of their training split; the test split is scored
once, at the end, and labelled test. They validated on the test split: best.pt, the printed best
val_top1 and early stopping picked a best-of-N test score."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from inceptionlab.config import load_recipe
from inceptionlab.data.readers import read_splits


@pytest.mark.parametrize("recipe,root", [("cifar10/small_cnn", "cifar_root"), ("fashion_mnist/mlp", "fashion_root"),
                                         ("mnist/mlp", "fashion_root")])
def test_validation_is_carved_out_of_the_training_split(recipe, root, request):
    data = request.getfixturevalue(root)
    cfg = load_recipe(recipe, [f"data.root={data}"]).data
    pair = read_splits(cfg)
    everything = load_recipe(recipe, [f"data.root={data}", "data.val_fraction=null"]).data
    guide = read_splits(everything)  # the guide's set-up: all training images, validation = test split
    assert pair.test is not None and torch.equal(pair.test.inputs, guide.val.inputs)
    assert len(pair.train) + len(pair.val) == len(guide.train)
    assert len(pair.val) == round(0.1 * len(guide.train))
    carved = {bytes(x.numpy()) for x in pair.val.inputs}
    assert not carved & {bytes(x.numpy()) for x in pair.train.inputs}


def test_the_test_split_is_scored_once_at_the_end_and_labelled_test(fashion_root, tmp_path, cli):
    result = cli("train", "fashion_mnist/mlp", "--data", fashion_root, "--out", tmp_path / "runs", "--no-progress",
                 "--set", "train.epochs=2")
    assert result.code == 0, result.err
    run = Path(result.out.strip().splitlines()[-1].removeprefix("run directory: "))
    summary = json.loads((run / "summary.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["val_samples"] for row in rows] == [30, 30]  # 10% of the 300 training images
    assert summary["test"]["samples"] == 100  # the whole test split, once
    test_line = next(line for line in result.out.splitlines() if line.startswith("test: "))
    assert f"top1 {summary['test']['top1']:.4f}" in test_line
    evaluated = json.loads(cli("evaluate", run, "--split", "test", "--json").out)
    assert evaluated["top1"] == pytest.approx(summary["test"]["top1"])
    assert evaluated["samples"] == 100
