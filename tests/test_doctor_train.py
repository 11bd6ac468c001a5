"""`inceptionlab doctor --train-check`: a small CNN trains on the embedded digits on every device."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from inceptionlab.doctor import train_check as doctor_train
from inceptionlab.doctor.train_check import TrainCheckSettings, load_digits_tensors, train_checks, train_on_device

# seconds=0: stop at min_steps (30), about 0.5 s on one CPU thread.
FAST = TrainCheckSettings(seconds=0.0)


@pytest.fixture(scope="module")
def digits():
    return load_digits_tensors()


def test_cpu_training_loss_falls_and_beats_chance(digits, one_cpu_thread):
    state = torch.get_rng_state()

    result = train_on_device("cpu", digits, FAST)

    assert result.ok, result.detail
    assert result.steps == FAST.min_steps
    assert result.last_loss < 0.5 * result.first_loss
    assert result.val_top1 >= 0.8
    assert result.images_per_s > 0
    assert torch.equal(torch.get_rng_state(), state)  # the caller's RNG is left alone


def test_digits_split_is_the_demo_split_and_disjoint(digits):
    assert (len(digits.train_y), len(digits.val_y)) == (1258, 539)  # 70% / 30% of 1,797
    assert digits.train_x.shape[1:] == (1, 8, 8)
    assert float(digits.train_x.min()) == -1.0 and float(digits.train_x.max()) == 1.0
    assert set(digits.val_y.tolist()) == set(range(10))


def test_training_that_does_not_learn_fails(digits, one_cpu_thread):
    result = train_on_device("cpu", digits, TrainCheckSettings(seconds=0.0, lr=1e-9))

    assert not result.ok
    assert "the loss did not fall below 0.5 x its start" in result.detail
    assert "held-out top-1 is under 0.8" in result.detail


def test_non_finite_loss_fails(digits, one_cpu_thread):
    result = train_on_device("cpu", digits, TrainCheckSettings(seconds=0.0, lr=float("inf")))

    assert not result.ok
    assert "the loss is not finite" in result.detail


def test_time_budget_trains_past_the_minimum_steps(digits, one_cpu_thread):
    result = train_on_device("cpu", digits, TrainCheckSettings(seconds=0.3, max_steps=200))

    assert FAST.min_steps <= result.steps <= 200
    assert result.seconds >= 0.3


def test_a_device_that_errors_is_a_failing_check_not_a_crash():
    # The meta device runs the forward pass but has no values to read back.
    entries = [{"type": "cpu", "device": "meta"}, {"device": "cuda:0", "error": "cannot query"}]

    checks = train_checks(entries, FAST)

    assert [(name, status) for name, status, _ in checks] == [("train meta", "fail")]
    assert entries[0]["train"]["status"] == "fail"
    assert checks[0][2].startswith("training failed: ")
    assert "train" not in entries[1]  # already failed its own check; not trained


def test_missing_scikit_learn_names_the_extra(monkeypatch):
    # An install without the demo extra: importing scikit-learn raises ImportError (None in sys.modules
    # makes Python refuse the import), and the real loader must turn that into the pointer to the extra.
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)

    checks = doctor_train.train_checks([{"type": "cpu", "device": "cpu"}], FAST)

    assert [(name, status) for name, status, _ in checks] == [("train", "fail")]
    assert "inceptionlab[demo]" in checks[0][2]


def test_cli_train_check_is_in_the_json(cli, one_cpu_thread):
    result = cli("doctor", "--train-check", "--train-seconds", "0", "--json")

    data = json.loads(result.out)
    cpu = next(d for d in data["devices"] if d["type"] == "cpu")
    assert cpu["train"]["status"] == "ok", cpu["train"]["detail"]
    assert cpu["train"]["steps"] == 30 and cpu["train"]["images_per_s"] > 0
    trained = [c for c in data["checks"] if c["name"].startswith("train ")]
    assert [c["name"] for c in trained] == [f"train {d['device']}" for d in data["devices"]]


def test_cli_without_train_check_does_not_train(cli):
    result = cli("doctor", "--json")

    data = json.loads(result.out)
    assert all("train" not in d for d in data["devices"])
    assert not [c for c in data["checks"] if c["name"].startswith("train")]
