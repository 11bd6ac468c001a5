"""`inceptionlab lr-find`: the range test, its suggestion rule, both parts, the weights left as they were."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import FAST

from inceptionlab.config import load_recipe
from inceptionlab.engine.lr_find import find_learning_rates, range_test, rates, recommendation, suggest

SMALL_CNN = ["model.name=cifar10_cnn", "data.train_crop_size=32", "data.val_resize_size=32", "data.val_crop_size=32"]


def test_rates_rise_exponentially():
    lrs = rates(1e-6, 1.0, 7)
    assert lrs == pytest.approx([1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0])


def test_suggestion_is_the_steepest_descent_and_a_diverging_loss_ends_the_test():
    """A loss that is flat, falls fastest around lr 1e-3 (a tanh step in log10 lr), then explodes past 1e-1."""
    def loss(lr: float) -> float:
        x = math.log10(lr)
        return 2.0 - math.tanh((x + 3) * 2) + (1e4 * (lr - 0.1) if lr > 0.1 else 0)

    test = range_test(loss, rates(1e-7, 10.0, 81))
    assert "diverged" in test.ended and test.lrs[-1] < 10.0
    # The smoothed curve lags the raw loss a few steps: the steepest point lands just after 1e-3.
    assert 1e-3 <= test.suggestion <= 1e-2
    assert suggest([1e-3, 1e-2, 1e-1, 1.0, 10.0], [1.0, 1.1, 1.2, 1.3, 1.4]) is None  # never falls: no suggestion


def test_lr_find_restores_the_weights_and_suggests_both_rates(image_folder):
    from inceptionlab.engine.session import build_training_session

    s = build_training_session(load_recipe("inception_v3/imagefolder", [*FAST, f"data.root={image_folder}", *SMALL_CNN]))
    before = {k: v.clone() for k, v in s.model.state_dict().items()}
    rng = torch.get_rng_state()
    results = find_learning_rates(s, 1e-5, 10.0, steps=12)
    assert set(results) == {"head", "body"} and all(len(r.lrs) >= 3 for r in results.values())
    for key, value in s.model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.requires_grad for p in s.model.parameters())
    found = recommendation(results)
    assert set(found) <= {"optim.lr", "finetune.body_lr_mult"}


def test_progress_advances_as_the_steps_run_not_before(image_folder):
    """The progress wrapper sees each rate when its step runs: the bar (or the log line) of a 50-minute
    range test on a CPU moved to 100% before the first step, then nothing."""
    from inceptionlab.engine.session import build_training_session

    s = build_training_session(load_recipe("inception_v3/imagefolder", [*FAST, f"data.root={image_folder}", *SMALL_CNN]))
    forwards = []
    s.model.get_submodule(s.parts.head_modules[0]).register_forward_hook(lambda *_: forwards.append(1))
    seen = []

    def progress(values):
        for value in values:
            seen.append(len(forwards))  # the head's forward passes run before this rate's step
            yield value

    find_learning_rates(s, 1e-5, 1e-3, steps=5, progress=progress)
    # Head then body: one step after each rate is handed out (before the head's first, its features are computed).
    assert len(seen) == 10 and [b - a for a, b in zip(seen, seen[1:])] == [1] * 9


def test_the_heads_range_test_steps_on_the_cached_features(image_folder):
    """The head's range test ran every step's images through the frozen body (13 minutes for 20 steps of
    Inception v3 on a CPU) where the head-only epochs use the body's features, computed once and cached:
    now the body sees each image once, the head steps on the vectors, and a run reads them from the cache."""
    from inceptionlab.engine import features
    from inceptionlab.engine.session import build_training_session

    s = build_training_session(load_recipe("inception_v3/imagefolder", [*FAST, f"data.root={image_folder}", *SMALL_CNN]))
    body_forwards, seen = [], {"head": [], "body": []}
    s.model.register_forward_hook(lambda *_: body_forwards.append(1))
    parts = iter(("head", "body"))

    def progress(values):
        part = next(parts)
        for value in values:
            seen[part].append(len(body_forwards))  # the whole model's forward passes before this rate's step
            yield value

    results = find_learning_rates(s, 1e-5, 1e-2, steps=6, progress=progress)
    assert len(set(seen["head"])) == 1 and seen["head"][0] > 0  # features first, then no pass through the body
    assert [b - a for a, b in zip(seen["body"], seen["body"][1:])] == [1] * 5  # the whole model: one per step
    assert all(math.isfinite(loss) for loss in results["head"].losses)
    assert len(list(features.cache_folder(s.train_set).glob("*.pt"))) == 2  # train and val, for the run's epochs


def test_cli_without_a_terminal_says_how_far_each_range_test_is(image_folder, tmp_path, cli):
    sets = [x for item in [*FAST, *SMALL_CNN] for x in ("--set", item)]
    result = cli("lr-find", "inception_v3/imagefolder", "--data", image_folder, *sets, "--steps", "20",
                 "--start", "1e-5", "--end", "1e-3", "--out", tmp_path / "lr", "--no-progress")
    assert result.code == 0, result.err
    lines = [line for line in result.out.splitlines() if line.startswith("range test ")]
    assert [line.split(":")[0] for line in lines] == ["range test head"] * 10 + ["range test body"] * 10
    assert lines[0].startswith("range test head: step 2/20, lr ") and "left" in lines[0]
    assert lines[-1].startswith("range test body: step 20/20, lr 0.001")


def test_cli_writes_the_plot_and_json(image_folder, tmp_path, cli):
    sets = [x for item in [*FAST, *SMALL_CNN] for x in ("--set", item)]
    result = cli("lr-find", "inception_v3/imagefolder", "--data", image_folder, *sets, "--steps", "10",
                 "--start", "1e-4", "--out", tmp_path / "lr", "--json", "--no-progress")
    assert result.code == 0, result.err
    report = json.loads(result.out.strip().splitlines()[-1])
    assert set(report["tests"]) == {"head", "body"} and "steepest descent" in report["rule"]
    plot = Path(report["plot"])
    assert plot.is_file() and plot.stat().st_size > 1000 and plot.parent.parent.parent == tmp_path / "lr" / "inception_v3"
    assert json.loads((plot.parent / "lr_find.json").read_text())["suggested"] == report["suggested"]
    assert len(report["tests"]["head"]["lrs"]) <= 10
    bad = cli("lr-find", "inception_v3/imagefolder", "--data", image_folder, "--start", "1", "--end", "0.1")
    assert bad.code == 2 and "start < end" in bad.err
