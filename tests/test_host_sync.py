"""The step loop and the evaluation meter wait for the device only where they must.

A host read of a device value (`float(t)`, `int(t)`, `bool(t)`, `.item()`, `.tolist()`) stalls the
host until the device has caught up; on a GPU one per step costs ~50 us, on small models as much as
the step itself. These tests count such reads on CPU tensors, where they behave the same way.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from inceptionlab.engine.loop import StepSettings, evaluate, train_one_epoch
from inceptionlab.engine.optim import build_optimizer
from inceptionlab.config import OptimConfig
from inceptionlab.engine.task import BinaryTask, MulticlassTask
from inceptionlab.metrics import ClassificationMeter, RunningMeter

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


# --- What a GPU would wait for, counted on the CPU ------------------------------------------------
# `tests/test_gpu_sync.py` runs the data path under torch.cuda.set_sync_debug_mode("error") where a GPU
# exists. Here the same mistakes are counted without one: a tensor built from Python numbers
# (`aten.lift_fresh`: on a GPU, a blocking copy from pageable memory) and a read of a tensor's value
# (`aten._local_scalar_dense`: `.item()`, `float()`), per step of a steady-state epoch.


class DeviceWaits(TorchDispatchMode):
    WAITS = (torch.ops.aten.lift_fresh.default, torch.ops.aten._local_scalar_dense.default)

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.WAITS:
            self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


def waits_per_call(call, times: int, kinds=DeviceWaits.WAITS) -> list[int]:
    """Waits of `kinds` counted during each of `times` calls, after one call to warm up."""
    call()
    counts = []
    for _ in range(times):
        with DeviceWaits() as mode:
            call()
        counts.append(sum(1 for name in mode.calls if name in {str(kind) for kind in kinds}))
    return counts


def test_device_augmentation_builds_its_constants_once():
    """Its host reads here (`axis_weights`' scale check, `row_taps`' span) are on CPU-only branches, which a
    GPU never takes (test_gpu_sync.py covers that side): only tensors built from Python numbers count."""
    from inceptionlab.data.transforms.device import DeviceAugment

    images = torch.randint(0, 256, (4, 3, 12, 12), dtype=torch.uint8)
    sizes = torch.full((4,), 12)
    generator = torch.Generator().manual_seed(0)
    for augment in (DeviceAugment(8, (0.5,) * 3, (0.25,) * 3, True, hflip=True),
                    DeviceAugment(8, (0.5,) * 3, (0.25,) * 3, False, resize_size=10)):
        made = waits_per_call(functools.partial(augment, images, sizes, sizes, generator), 3, [torch.ops.aten.lift_fresh.default])
        assert made == [0, 0, 0]


@pytest.mark.parametrize("task", [MulticlassTask(3), BinaryTask()])
def test_meter_updates_never_wait_for_the_device(task):
    binary = isinstance(task, BinaryTask)
    meter = task.meter(torch.device("cpu"), confusion=True)
    logits, targets = torch.randn(4, 1 if binary else 3), torch.tensor([0, 1, 1, 0])
    assert waits_per_call(lambda: meter.update(logits, targets, task.eval_loss(logits, targets)), 3) == [0, 0, 0]
    running = RunningMeter(torch.device("cpu"))
    loss, correct = torch.tensor(0.5), torch.tensor(3.0)
    assert waits_per_call(lambda: running.update(loss, correct, 4), 3) == [0, 0, 0]


def test_resident_loaders_build_one_index_tensor_per_epoch_and_none_per_step(tmp_path):
    """Tensors built from Python numbers (on a GPU, copies from pageable memory) while an epoch's batches
    are drawn: the epoch's order, once. (The image loader's host reads here are DeviceAugment's CPU-only
    branches, see above.)"""
    from conftest import make_image_folder

    from inceptionlab.data.datasets.imagefolder import RobustImageFolder
    from inceptionlab.data.loading.image_options import DeviceImageOptions
    from inceptionlab.data.loading.loaders import make_loader
    from inceptionlab.data.splits import ArraySplit

    arrays = ArraySplit(torch.zeros(24, 1, 4, 4, dtype=torch.uint8), torch.arange(24) % 2, ["x", "y"])
    folder = RobustImageFolder(make_image_folder(tmp_path / "d", train_per_class=8, size=10) / "train")
    options = DeviceImageOptions(train_size=8, val_resize_size=8, val_crop_size=8, cache_size=10, hflip=True)
    for split, images in ((arrays, None), (folder, options)):
        for train in (True, False):
            loader = make_loader(split, batch_size=4, train=train, seed=0, num_workers=0, mode="resident",
                                 images=images)
            loader.set_epoch(0)
            list(loader)  # warm-up
            with DeviceWaits() as mode:
                batches = list(loader)
            made = [call for call in mode.calls if call == str(torch.ops.aten.lift_fresh.default)]
            assert len(batches) == 6 and len(made) == 1, mode.calls
