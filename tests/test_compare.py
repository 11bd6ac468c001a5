"""`inceptionlab compare`: two evaluations paired image by image, judged by McNemar's exact test."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from inceptionlab.errors import UserError
from inceptionlab.fileio import sha256_file
from inceptionlab.judge.compare import compare, mcnemar_exact_p, stale_note
from inceptionlab.judge.results import read_results, write_results
from helpers.page_examples import check_example

LABELS = ["cat", "dog", "owl"]


def table(folder: Path, true: list[int], pred: list[int], files: list[str] | None = None, **meta) -> Path:
    """An evaluation's results whose model answers `pred`, as `evaluate` writes them."""
    folder.mkdir(parents=True)
    logits = np.zeros((len(true), len(LABELS)), np.float32)
    logits[np.arange(len(true)), pred] = 4.0
    files = files if files is not None else [f"/photos/{LABELS[t]}/{i}.jpg" for i, t in enumerate(true)]
    write_results(folder, logits, np.array(true), files=files, samples=list(range(len(true))), labels=LABELS,
                  meta={"split": "val", "data": "/photos", "model": str(folder), "run_dir": None, **meta})
    return folder


def test_the_exact_mcnemar_p_value_on_known_splits():
    assert mcnemar_exact_p(2, 6) == pytest.approx(2 * 37 / 256)  # P(X <= 2 | n=8, 1/2) = (1 + 8 + 28) / 256
    assert mcnemar_exact_p(0, 6) == pytest.approx(2 / 64)
    assert mcnemar_exact_p(6, 2) == mcnemar_exact_p(2, 6)
    assert mcnemar_exact_p(0, 0) == 1.0 and mcnemar_exact_p(5, 5) == 1.0
    # thousands of disagreements: finite, and near the normal approximation with continuity correction
    only_a, only_b = 4_900, 5_100
    z = (abs(only_a - only_b) - 1) / math.sqrt(only_a + only_b)
    assert mcnemar_exact_p(only_a, only_b) == pytest.approx(math.erfc(z / math.sqrt(2)), rel=0.02)


def test_pairs_by_image_and_counts_the_images_only_one_model_gets_right(tmp_path):
    #          cat cat cat cat dog dog dog owl
    true = [0, 0, 0, 0, 1, 1, 1, 2]
    a = table(tmp_path / "a", true, [0, 1, 1, 1, 1, 0, 1, 2])  # right on 0, 4, 6, 7
    b = table(tmp_path / "b", true, [0, 0, 0, 1, 1, 1, 0, 2])  # right on 0, 1, 2, 4, 5, 7
    result = compare(read_results(a), read_results(b))
    assert result["samples"] == 8 and result["only_in_a"] == result["only_in_b"] == 0
    assert (result["top1_a"], result["top1_b"], result["difference"]) == (0.5, 0.75, 0.25)
    assert result["b_right_a_wrong"] == ["/photos/cat/1.jpg", "/photos/cat/2.jpg", "/photos/dog/5.jpg"]
    assert result["a_right_b_wrong"] == ["/photos/dog/6.jpg"]
    assert result["p_value"] == pytest.approx(mcnemar_exact_p(1, 3), abs=1e-6) and result["p_value"] == 0.625
    assert result["verdict"].startswith("no clear difference (McNemar p = 0.625)")
    low, high = result["ci95"]
    assert low < 0 < 0.25 < high  # the interval holds the difference and, here, zero
    changes = {row["label"]: row for row in result["per_class"]}
    assert changes["cat"] == {"label": "cat", "n": 4, "recall_a": 0.25, "recall_b": 0.75, "change": 0.5}
    assert changes["dog"]["change"] == 0.0 and changes["owl"]["change"] == 0.0
    assert result["per_class"][0]["label"] == "cat"  # largest change first


def test_a_clear_difference_is_called_for_the_better_model(tmp_path):
    true = [0] * 12
    a = table(tmp_path / "a", true, [1] * 12)
    b = table(tmp_path / "b", true, [0] * 10 + [1] * 2)
    result = compare(read_results(a), read_results(b))
    assert result["verdict"].startswith("B is better: right on 10 image(s) the other gets wrong, wrong on 0")
    assert compare(read_results(b), read_results(a))["verdict"].startswith("A is better")
    assert result["ci95"][0] > 0


def test_images_only_one_evaluation_scored_are_left_out_and_counted(tmp_path):
    a = table(tmp_path / "a", [0, 1, 2], [0, 1, 2], files=["/p/x.jpg", "/p/y.jpg", "/p/z.jpg"])
    b = table(tmp_path / "b", [1, 2], [0, 2], files=["/p/y.jpg", "/p/new.jpg"])
    result = compare(read_results(a), read_results(b))
    assert (result["samples"], result["only_in_a"], result["only_in_b"]) == (1, 2, 1)
    assert result["a_right_b_wrong"] == ["/p/y.jpg"]


def test_tables_that_cannot_be_paired_are_refused_naming_why(tmp_path):
    a = table(tmp_path / "a", [0, 1], [0, 1], files=["/p/x.jpg", "/p/y.jpg"])
    other = table(tmp_path / "other", [0], [0], files=["/q/x.jpg"])
    with pytest.raises(UserError, match="scored no image in common"):
        compare(read_results(a), read_results(other))
    relabelled = table(tmp_path / "relabelled", [0, 0], [0, 0], files=["/p/x.jpg", "/p/y.jpg"])
    with pytest.raises(UserError, match=r"/p/y.jpg: labelled 'dog' in .* and 'cat' in "):
        compare(read_results(a), read_results(relabelled))
    # in-memory splits (no files) pair by index: only on the same split of the same data
    val = table(tmp_path / "val", [0, 1], [0, 1], files=["", ""])
    test = table(tmp_path / "test", [0, 1], [0, 1], files=["", ""], split="test")
    with pytest.raises(UserError, match="both must score the same split of the same data"):
        compare(read_results(val), read_results(test))
    same = table(tmp_path / "same", [0, 1], [1, 1], files=["", ""])
    assert compare(read_results(val), read_results(same))["a_right_b_wrong"] == ["#0"]


def test_an_evaluation_of_weights_that_changed_since_is_flagged(tmp_path):
    weights = tmp_path / "model.pt"
    weights.write_bytes(b"epoch 3")
    folder = table(tmp_path / "eval", [0], [0], weights_file=str(weights), weights_sha256=sha256_file(weights))
    assert stale_note(read_results(folder)) is None
    weights.write_bytes(b"epoch 9")  # training resumed into the run after the evaluation
    note = stale_note(read_results(folder))
    assert note is not None and f"scored an earlier {weights}: the file has changed since" in note


def test_the_command_prints_the_comparison_and_json_and_refuses_an_unevaluated_run(tmp_path, cli):
    true = [0] * 12
    a = table(tmp_path / "a" / "eval", true, [1] * 12)
    b = table(tmp_path / "b" / "eval", true, [0] * 10 + [1] * 2)
    printed = cli("compare", a.parent, b.parent)  # run directories: their eval/ is read
    assert printed.code == 0, printed.err
    lines = printed.out.splitlines()
    assert lines[:3] == [f"A: {a}", f"B: {b}", "12 images scored by both"]
    assert "top-1  A 0.0000  B 0.8333  B - A +0.8333" in printed.out
    assert "  B right, A wrong: 10 image(s): /photos/cat/0.jpg, /photos/cat/1.jpg, /photos/cat/2.jpg, " in printed.out
    assert "B is better: right on 10 image(s)" in printed.out
    assert any(line.split() == ["cat", "12", "0.000", "0.833", "+0.833"] for line in lines)
    check_example("errors-compare", printed.out, labels=["cat", "dog", "fox"])
    as_json = cli("compare", a, b, "--json")
    assert as_json.code == 0 and json.loads(as_json.out)["b_right_a_wrong"][:1] == ["/photos/cat/0.jpg"]
    (tmp_path / "fresh").mkdir()
    refused = cli("compare", a, tmp_path / "fresh")
    assert refused.code == 2 and "run `inceptionlab evaluate" in refused.err
    assert len(refused.err.strip().splitlines()) == 1
