"""`evaluate`'s per-image results table (results.csv + logits.npy + results.json), as pandas reads it."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.small_runs import PLANTED, small_run

from inceptionlab.errors import UserError
from inceptionlab.judge.results import (SampleFiles, as_two_class, check_aligned, read_results, sample_files,
                                        write_results)


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """A private copy of the small run (helpers/small_runs.py); each test runs `evaluate` on it."""
    return small_run(tmp_path_factory).copy(tmp_path_factory.mktemp("results_table"))


def _evaluate(cli, *args):
    result = cli("evaluate", *args, "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


def test_evaluate_writes_one_row_per_image_that_pandas_reads(evaluated, cli):
    pandas = pytest.importorskip("pandas", reason="pandas reads the table in this test (cleanlab brings it)")
    report = _evaluate(cli, evaluated.run_dir)
    files = {key: Path(report["files"][key]) for key in ("results_csv", "logits", "results_json")}
    assert all(path.parent == evaluated.run_dir / "eval" and path.is_file() for path in files.values())
    table = pandas.read_csv(files["results_csv"])
    logits = np.load(files["logits"])
    val_files = sorted(str(p.absolute()) for p in (evaluated.data / "val").rglob("*.png"))
    assert sorted(table["file"]) == val_files and len(table) == report["samples"] == 18
    assert list(table["row"]) == list(range(18)) and logits.shape == (18, 3) and logits.dtype == np.float32
    # Each row is the image it names: its folder is its true class.
    assert (table["file"].map(lambda f: Path(f).parent.name) == table["true_label"]).all()
    probs = torch.from_numpy(logits).double().softmax(dim=1).numpy()
    rows = np.arange(18)
    assert np.allclose(table["p_true"], probs[rows, table["true_index"]], atol=2e-6)
    assert np.allclose(table["loss"], -np.log(np.maximum(probs[rows, table["true_index"]], 1e-300)), rtol=1e-4, atol=2e-6)
    assert (table["pred_index"] == probs.argmax(axis=1)).all() and (table["top1_index"] == table["pred_index"]).all()
    assert (table["correct"] == (table["pred_index"] == table["true_index"])).all()
    assert (table["top1_prob"] >= table["top2_prob"]).all() and (table["top2_prob"] >= table["top3_prob"]).all()
    # The table adds up to what evaluate reports.
    assert table["correct"].mean() == pytest.approx(report["top1"])
    assert table["loss"].mean() == pytest.approx(report["loss"], rel=1e-4)
    # The planted label errors are wrong, and called by their colour.
    for source, wrong in PLANTED:
        row = table[table["file"].str.endswith(f"{wrong}/planted_{source}_0.png")].iloc[0]
        assert row["true_label"] == wrong and row["pred_label"] == source and row["correct"] == 0
    meta = json.loads(files["results_json"].read_text())
    assert meta["labels"] == ["cat", "dog", "fox"] and meta["split"] == "val" and meta["task"] == "multiclass"
    assert meta["rows"] == 18 and meta["topk"] == 3 and meta["run_dir"] == str(evaluated.run_dir.absolute())


def test_read_results_gives_the_same_rows_and_logits(evaluated, cli):
    _evaluate(cli, evaluated.run_dir)
    results = read_results(evaluated.run_dir)  # a run directory: its eval/ folder
    assert len(results.rows) == 18 and results.labels == ["cat", "dog", "fox"]
    assert isinstance(results.rows[0]["loss"], float) and isinstance(results.rows[0]["true_index"], int)
    assert results.targets.tolist() == [r["true_index"] for r in results.rows]
    cooled = results.probabilities(temperature=2.0)
    assert np.allclose(cooled, torch.from_numpy(results.logits).double().div(2).softmax(1).numpy())
    assert np.allclose(results.probabilities()[np.arange(18), results.targets], [r["p_true"] for r in results.rows],
                       atol=2e-6)


def test_an_unreadable_image_is_no_row_and_the_rows_keep_their_files(evaluated, cli, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(evaluated.data, data)
    (data / "val" / "cat" / "cat_2b.png").write_bytes(b"not a png")  # sorts between cat_2 and cat_3
    report = _evaluate(cli, evaluated.run_dir, "--data", data, "--out", tmp_path / "eval")
    results = read_results(tmp_path / "eval")
    assert report["samples"] == len(results.rows) == 18
    assert not any(r["file"].endswith("cat_2b.png") for r in results.rows)
    assert all(Path(r["file"]).parent.name == r["true_label"] for r in results.rows)
    # cat/ holds cat_1, cat_2, cat_2b, cat_3 ... (cat_0 is planted under dog/): sample 2 is the broken file.
    assert [r["sample"] for r in results.rows][:6] == [0, 1, 3, 4, 5, 6]


class _Folder:
    samples = [("a/0.png", 0), ("a/1.png", 0), ("b/2.png", 1), ("b/3.png", 1)]

    def __len__(self):
        return len(self.samples)


def test_sample_files_follow_subsets_and_relabelling():
    from torch.utils.data import Subset

    from inceptionlab.judge.evaluate import TargetMap

    wrapped = Subset(TargetMap(_Folder(), [7, 3]), [3, 1, 2])  # type: ignore[arg-type]
    rows = sample_files(wrapped, skipped=["b/2.png"])
    assert rows.samples == [3, 1] and [Path(f).name for f in rows.files] == ["3.png", "1.png"]
    assert rows.targets == [3, 7]  # the model's output indices, not the folders'
    check_aligned(rows, np.array([3, 7]))
    with pytest.raises(RuntimeError, match="out of step"):
        check_aligned(rows, np.array([7, 3]))
    with pytest.raises(RuntimeError, match="out of step"):
        check_aligned(SampleFiles([0, 1], ["", ""], None), np.array([0]))


def test_a_binary_logit_is_stored_as_two_class_logits():
    z = torch.tensor([[-2.0], [0.0], [3.0]])
    two = as_two_class(z)
    assert two.shape == (3, 2) and torch.allclose(two.softmax(1)[:, 1], torch.sigmoid(z[:, 0]))
    assert torch.equal(as_two_class(torch.ones(2, 4)), torch.ones(2, 4))


def test_write_results_refuses_columns_of_different_lengths(tmp_path):
    with pytest.raises(RuntimeError, match="out of step"):
        write_results(tmp_path, np.zeros((2, 3), np.float32), np.zeros(3, np.int64), files=["", "", ""],
                      samples=[0, 1, 2], labels=["a", "b", "c"], meta={})


def test_reading_a_run_that_was_never_evaluated_says_what_to_run(tmp_path):
    (tmp_path / "eval").mkdir()
    with pytest.raises(UserError, match="run `inceptionlab evaluate"):
        read_results(tmp_path)


def test_a_mismatched_logits_file_is_refused(tmp_path):
    write_results(tmp_path, np.zeros((2, 2), np.float32), np.array([0, 1]), files=["x", "y"], samples=[0, 1],
                  labels=["a", "b"], meta={})
    np.save(tmp_path / "logits.npy", np.zeros((3, 2), np.float32))
    with pytest.raises(UserError, match="different evaluations"):
        read_results(tmp_path)


def test_duckdb_reads_the_table(evaluated, cli):
    duckdb = pytest.importorskip("duckdb", reason="DuckDB is not installed (the table is plain CSV; pandas is tested above)")
    _evaluate(cli, evaluated.run_dir)
    table = evaluated.run_dir / "eval" / "results.csv"
    [(count, accuracy, worst)] = duckdb.connect().execute(
        f"select count(*), avg(correct), max(loss) from read_csv_auto('{table}')").fetchall()
    assert count == 18 and math.isclose(accuracy, 16 / 18) and worst > 1.0
