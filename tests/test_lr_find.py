"""`inceptionlab lr-find`: the range test, its suggestion rule, both parts, the weights left as they were."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torchvision
from conftest import FAST
from helpers.page_examples import check_example

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
    assert set(found.values) <= {"optim.lr", "finetune.body_lr_mult"}


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
    check_example("fine-tuning-lr-find-progress", result.out)


def test_a_linear_probe_tests_the_head_alone_and_suggests_no_body_rate(image_folder, tmp_path, cli):
    """inception_v3/imagefolder is a linear probe by default (finetune.body_lr_mult=0): the body never trains,
    so its range test (full training steps: most of half an hour for Inception v3 on a CPU) is skipped and said,
    and the suggestion is optim.lr alone (a finetune.body_lr_mult would turn the probe into whole-model training)."""
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18(num_classes=3).state_dict(), tmp_path / "start.pt")
    sets = [x for item in [*FAST, "finetune.body_lr_mult=0", "model.name=resnet18", f"model.weights={tmp_path / 'start.pt'}",
                           "data.train_crop_size=32", "data.val_resize_size=32", "data.val_crop_size=32"]
            for x in ("--set", item)]
    result = cli("lr-find", "inception_v3/imagefolder", "--data", image_folder, *sets, "--steps", "8",
                 "--start", "1e-4", "--out", tmp_path / "lr", "--json", "--no-progress")
    assert result.code == 0, result.err
    report = json.loads(result.out.strip().splitlines()[-1])
    assert set(report["tests"]) == {"head"} and set(report["suggested"]) <= {"optim.lr"}
    assert "body: not tested: finetune.body_lr_mult=0 keeps the body frozen for the whole run" in result.err
    assert not [line for line in result.err.splitlines() if line.startswith("range test body")]


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


# ---------------------------------------------------------------- the suggestion rule on recorded curves

def replay(losses: list[float]):
    """A step function that returns the recorded losses in turn, whatever the rate."""
    recorded = iter(losses)
    return lambda lr: next(recorded)


def ignite_lr_suggestion(lrs: list[float], losses: list[float]) -> float:
    """pytorch-ignite's FastaiLRFinder.lr_suggestion (ignite/handlers/lr_finder.py, 0.5), transcribed: the
    steepest central difference of the loss up to its minimum, "ignoring the increasing part of the curve"."""
    min_loss_idx = int(torch.tensor(losses).argmin())
    decreasing = torch.tensor(losses[: min_loss_idx + 1])
    grads = torch.tensor([0.5 * (decreasing[i + 1] - decreasing[i - 1]) for i in range(1, len(decreasing) - 1)])
    return lrs[int(grads.argmin()) + 1]


def lightning_2_4_suggestion(lrs: list[float], losses: list[float], skip_begin: int = 10, skip_end: int = 1) -> float:
    """Lightning's _LRFinder.suggestion before 2.5 (np.gradient over the steps: log10(lr) for an exponential test)."""
    import numpy as np

    window = np.asarray(losses[skip_begin:-skip_end])
    return lrs[skip_begin + int(np.argmin(np.gradient(window)))]


def smoothed_as_recorded(losses: list[float], beta: float = 0.98) -> list[float]:
    """fastai's smoothed loss (bias-corrected exponential moving average) of a whole recorded test."""
    average, smoothed = 0.0, []
    for k, loss in enumerate(losses):
        average = beta * average + (1 - beta) * loss
        smoothed.append(average / (1 - beta ** (k + 1)))
    return smoothed


def test_a_blown_up_loss_ends_the_test_and_the_suggestion_stays_before_its_minimum():
    """Issue 43's body curve: the smoothed loss (beta 0.98, ~50 steps of memory in a 60-step test) rose from
    1.09 to ~3.7 and never reached 4x its best, so the test ran to lr 10 and the steepest descent was a
    dip inside the blown-up part, at 1.54, past the loss's minimum."""
    from helpers.lr_curves import BODY_BLOWN_UP, BODY_BLOWN_UP_STEPS

    lrs = rates(*BODY_BLOWN_UP_STEPS)
    test = range_test(replay(BODY_BLOWN_UP), lrs)
    assert test.ended.startswith("diverged at lr ")
    assert test.lrs[-1] < 0.1  # stopped a few steps into the blow-up (the loss over 4x its best from step 39)
    lowest = test.lrs[test.smoothed.index(min(test.smoothed))]
    assert test.suggestion is not None and test.suggestion < lowest
    # The whole smoothed curve the recorded run had (to lr 10): the rule alone keeps before its minimum,
    # where Lightning's before 2.5 (the steepest descent anywhere) gave the 1.54 that was printed.
    smoothed = smoothed_as_recorded(BODY_BLOWN_UP)
    assert lightning_2_4_suggestion(lrs, smoothed, skip_begin=6) == pytest.approx(1.536, rel=1e-3)
    assert suggest(lrs, smoothed) < lrs[smoothed.index(min(smoothed))] < 0.01
    assert suggest(lrs, smoothed) == ignite_lr_suggestion(lrs[6:], smoothed[6:])


@pytest.mark.parametrize("seed", range(20))
def test_the_suggestion_is_ignites_on_the_curve_after_its_first_tenth(seed):
    """Ours = ignite's rule applied after the first 10% of steps (fastai and Lightning skip those too)."""
    from helpers.lr_curves import u_shaped

    lrs = rates(1e-7, 10.0, 100)
    test = range_test(replay(u_shaped(seed)), lrs)
    begin = max(1, int(len(test.smoothed) * 0.1))
    assert test.suggestion == ignite_lr_suggestion(test.lrs[begin:], test.smoothed[begin:])
    assert test.suggestion < test.lrs[test.smoothed.index(min(test.smoothed))]


def test_the_head_and_body_recommendation_says_when_the_body_rate_is_capped():
    """The body's suggestion ~3e6x the head's became finetune.body_lr_mult=1 without a word."""
    from inceptionlab.engine.lr_find import RangeTest

    head, body = RangeTest("head", suggestion=4.76e-7), RangeTest("body", suggestion=1.54)
    found = recommendation({"head": head, "body": body})
    assert found.values == {"optim.lr": 4.76e-7, "finetune.body_lr_mult": 1.0}
    (note,) = found.notes
    assert "finetune.body_lr_mult" in note and "capped at 1" in note and "3.2e+06" in note
    plain = recommendation({"head": RangeTest("head", suggestion=0.01), "body": RangeTest("body", suggestion=0.001)})
    assert plain.values == {"optim.lr": 0.01, "finetune.body_lr_mult": pytest.approx(0.1)} and plain.notes == []
    alone = recommendation({"head": RangeTest("head"), "body": RangeTest("body", suggestion=0.001)})
    assert alone.values == {"optim.lr": 0.001} and "head" in alone.notes[0]


def test_the_plot_shows_both_suggestions_on_their_curves():
    """The y-axis stopped near 1.27 (from the lowest loss to a bit above the start), so both marked
    rates sat off the visible curves."""
    from helpers.lr_curves import BODY_BLOWN_UP

    from inceptionlab.plots import draw_lr_find, new_figure

    lrs = rates(1e-7, 10.0, 60)
    smoothed = smoothed_as_recorded(BODY_BLOWN_UP)
    head = {"lrs": lrs[:40], "smoothed": [1.1 - 0.02 * k for k in range(40)], "suggestion": lrs[5]}
    body = {"lrs": lrs, "smoothed": smoothed, "suggestion": lrs[53]}
    _, ax = new_figure((6.4, 4.0))
    draw_lr_find(ax, {"head": head, "body": body})
    low, high = ax.get_ylim()
    for test in (head, body):
        at = test["smoothed"][test["lrs"].index(test["suggestion"])]
        assert low < at < high
    assert len([c for c in ax.collections if len(c.get_offsets())]) == 2  # each suggestion a point on its curve


def test_cli_reports_its_notes_and_keeps_each_suggestion_before_its_minimum(image_folder, tmp_path, cli):
    sets = [x for item in [*FAST, *SMALL_CNN] for x in ("--set", item)]
    result = cli("lr-find", "inception_v3/imagefolder", "--data", image_folder, *sets, "--steps", "12",
                 "--start", "1e-4", "--out", tmp_path / "lr", "--json", "--no-progress")
    assert result.code == 0, result.err
    report = json.loads(result.out.strip().splitlines()[-1])
    assert isinstance(report["notes"], list)
    for test in report["tests"].values():
        if test["suggestion"] is not None:
            assert test["suggestion"] < test["lrs"][test["smoothed"].index(min(test["smoothed"]))]


def test_the_fine_tuning_pages_example_is_what_the_command_prints_for_such_curves():
    """Two curves that fall, then jump (the smoothed loss over 4x its best at once), the body's steepest
    descent far above the head's: the lines the command prints, with the cap's note."""
    import math as m

    from inceptionlab.cli.lr_find import summary_lines

    def curve(centre: int, jump: int) -> list[float]:
        return [2 - m.tanh((k - centre) / 3) if k < jump else 1000.0 for k in range(60)]

    lrs = rates(1e-7, 10.0, 60)
    results = {"head": range_test(replay(curve(15, 49)), lrs, "head"), "body": range_test(replay(curve(40, 54)), lrs, "body")}
    lines = summary_lines(results, recommendation(results), Path("runs/lr-find/x/lr_find.png"))
    check_example("fine-tuning-lr-find", "\n".join(lines))


def test_the_whole_models_range_test_runs_batchnorm_as_the_run_will(image_folder, tmp_path):
    """The body's range test trained every BatchNorm layer on batch statistics (plain `train()`), while a run
    from trained weights keeps their running statistics (finetune.bn=auto: frozen, issue 41): the rate it
    suggested was measured on another model. Its steps now enter the mode the whole-model epochs enter."""
    import torchvision

    from inceptionlab.engine.lr_find import _data_path
    from inceptionlab.engine.session import build_training_session

    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18(num_classes=3).state_dict(), tmp_path / "start.pt")
    s = build_training_session(load_recipe("inception_v3/imagefolder", [
        *FAST, f"data.root={image_folder}", "model.name=resnet18", f"model.weights={tmp_path / 'start.pt'}",
        "data.train_crop_size=32", "data.val_resize_size=32", "data.val_crop_size=32", "finetune.bn=auto"]))
    assert s.recipe.finetune.bn == "frozen"
    path = _data_path(s, "body", lambda line: None)
    path.train_mode(path.runner)
    body_norms = [m for name, m in s.model.named_modules()
                  if isinstance(m, torch.nn.BatchNorm2d) and not name.startswith("fc")]
    assert body_norms and not any(m.training for m in body_norms)
