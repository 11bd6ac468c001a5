"""The embedded demo: the digits ImageFolder and the `demo` command end to end (shortened)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inceptionlab.data.datasets.digits import SPLITS, ensure_digits_imagefolder
from inceptionlab.errors import UserError
from helpers.page_examples import check_example


def count(folder: Path) -> int:
    return len(list(folder.rglob("*.png")))


def test_digits_imagefolder_is_complete_stratified_and_reused(tmp_path):
    root = ensure_digits_imagefolder(tmp_path / "digits")
    counts = {s: count(root / s) for s in SPLITS}
    assert sum(counts.values()) == 1797  # every real digit, each in exactly one split
    assert counts["train"] > counts["val"] > counts["test"] > 0
    for split in SPLITS:
        assert sorted(p.name for p in (root / split).iterdir()) == [str(d) for d in range(10)]
    names = {s: {p.name for p in (root / s).rglob("*.png")} for s in SPLITS}
    assert not (names["train"] & names["val"]) and not (names["train"] & names["test"])
    stamp = (root / "train").stat().st_mtime_ns
    assert ensure_digits_imagefolder(root) == root and (root / "train").stat().st_mtime_ns == stamp
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".digits-")]  # no temp folder left


def test_digits_refuses_a_foreign_non_empty_folder(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.txt").write_text("precious")
    with pytest.raises(UserError, match="not a digits ImageFolder"):
        ensure_digits_imagefolder(tmp_path / "mine")
    assert (tmp_path / "mine" / "thesis.txt").read_text() == "precious"


def test_demo_command_trains_evaluates_plots_and_predicts(tmp_path, cli):
    result = cli("demo", "--out", tmp_path / "runs", "--data", tmp_path / "digits", "--samples", "4",
                 "--no-progress", "--set", "train.epochs=1", "--set", "data.max_train_samples=96",
                 "--set", "data.max_val_samples=48")
    assert result.code == 0, result.err
    assert "validation: top-1" in result.out and "run directory:" in result.out
    check_example("first-steps-demo", result.out)
    assert result.out.count(" predicted ") == 4
    run = next((tmp_path / "runs" / "demo" / "digits").iterdir())
    assert (run / "plots" / "loss.png").is_file() and (run / "plots" / "confusion.png").is_file()
    assert (run / "model.pt").is_file()
