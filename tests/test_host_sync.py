"""The step loop and the evaluation meter wait for the device only where they must.

A host read of a device value (`float(t)`, `int(t)`, `bool(t)`, `.item()`, `.tolist()`) stalls the
host until the device has caught up; on a GPU one per step costs ~50 us, on small models as much as
the step itself. These tests count such reads on CPU tensors, where they behave the same way.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inceptionlab.engine.loop import StepSettings, evaluate, train_one_epoch
from inceptionlab.engine.optim import build_optimizer
from inceptionlab.config import OptimConfig
from inceptionlab.engine.task import BinaryTask, MulticlassTask
from inceptionlab.metrics import ClassificationMeter

HOST_READS = ("__float__", "__int__", "__bool__", "item", "tolist")


@pytest.fixture
def host_reads(monkeypatch):
    """A list that gets one entry per host read of a tensor value."""
    reads: list[str] = []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _name=name, _original=original, **kwargs):
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    return reads


def batches(steps: int, batch: int = 4, classes: int = 3):
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(batch, 5, generator=generator), torch.randint(0, classes, (batch,), generator=generator))
            for _ in range(steps)]


def train(loader, log_every, should_stop=lambda: False, on_log=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    optimizer = build_optimizer(model.parameters(), OptimConfig(name="adam", lr=0.01))
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    settings = StepSettings(torch.device("cpu"), log_every=log_every)
    return train_one_epoch(model, loader, MulticlassTask(3), optimizer, scaler, settings,
                           on_log=on_log, agree=lambda loss: (should_stop(), [loss]))


def test_stop_is_asked_at_log_intervals_and_at_the_epoch_end_only():
    asked_at: list[int] = []
    logged: list[int] = []
    result = train(batches(12), log_every=5, should_stop=lambda: asked_at.append(len(logged)) or False,
                   on_log=lambda step, loss: logged.append(step))
    assert logged == [5, 10]
    assert asked_at == [1, 2, 2]  # after the logs of steps 5 and 10, then once at the end (step 12)
    assert not result.stopped and result.steps == 12


def test_a_stop_takes_effect_at_the_interval_end():
    calls = iter([False, True])
    result = train(batches(12), log_every=5, should_stop=lambda: next(calls))
    assert result.stopped and result.steps == 10 and result.samples == 40


def test_stop_at_epoch_end_when_steps_do_not_fill_an_interval():
    result = train(batches(3), log_every=5, should_stop=lambda: True)
    assert result.stopped and result.steps == 3


def test_training_reads_the_device_once_per_log_interval(host_reads):
    train(batches(20), log_every=10)
    # Two log intervals (one float() each) and the epoch's metrics (one tolist()): nothing per step.
    assert sorted(host_reads) == ["__float__", "__float__", "tolist"]


def test_interval_loss_is_the_sample_weighted_mean_of_the_interval():
    logged: dict[int, float] = {}
    train(batches(6), log_every=3, on_log=lambda step, loss: logged.__setitem__(step, loss))
    assert set(logged) == {3, 6} and all(0 < loss < 5 for loss in logged.values())


@pytest.mark.parametrize("task", [MulticlassTask(3), BinaryTask()])
def test_evaluation_reads_do_not_grow_with_the_number_of_batches(host_reads, task):
    binary = isinstance(task, BinaryTask)
    model = nn.Linear(5, 1 if binary else 3)

    def reads_for(steps: int) -> list[str]:
        host_reads.clear()
        loader = [(x, y % 2 if binary else y) for x, y in batches(steps)]
        result = evaluate(model, loader, task, StepSettings(torch.device("cpu")))
        assert result["samples"] == 4 * steps
        return sorted(host_reads)

    few, many = reads_for(2), reads_for(9)
    assert few == many and many.count("tolist") == 1  # the sums come back once, whatever the batch count


def test_meter_update_never_reads_the_device(host_reads):
    meter = ClassificationMeter(3, confusion=True)
    for _, y in batches(5):
        meter.update(torch.randn(4, 3), y, torch.tensor(0.7))
    assert host_reads == []
