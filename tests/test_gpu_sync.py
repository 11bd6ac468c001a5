"""On a GPU, the data path and the meters never make the host wait for the device inside an epoch.

`torch.cuda.set_sync_debug_mode("error")` raises on every synchronising call: a blocking copy of an
index from pageable memory, a tensor built from Python numbers on the device (mean/std rebuilt per
batch, a per-batch count), `.item()`. Training and evaluation epochs run under it on each loader; the
one read of an epoch's sums (`compute()`) and the loader's start-up stay outside it.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from conftest import make_image_folder
from torch import nn

from inceptionlab.config import DataConfig, OptimConfig
from inceptionlab.data.datasets.imagefolder import RobustImageFolder
from inceptionlab.data.loading.image_options import DeviceImageOptions
from inceptionlab.data.loading.loaders import make_loader
from inceptionlab.data.splits import ArraySplit
from inceptionlab.data.transforms.host import train_transform
from inceptionlab.engine.loop import StepSettings, train_step
from inceptionlab.engine.optim import build_optimizer
from inceptionlab.engine.task import MulticlassTask
from inceptionlab.metrics import RunningMeter
from inceptionlab.models.spec import Normalize, eval_transform

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")]

LOADERS = ["arrays_resident", "arrays_workers", "images_resident", "images_stream", "images_workers"]


@contextmanager
def syncs_are_errors():
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def loaders(kind: str, tmp_path, device):
    source, mode = kind.split("_")
    common = dict(seed=0, num_workers=2 if mode == "workers" else 0, pin_memory=True, device=device, mode=mode)
    if source == "arrays":
        split = ArraySplit(torch.randint(0, 256, (40, 3, 16, 16), dtype=torch.uint8), torch.arange(40) % 3,
                           ["a", "b", "c"])
        return make_loader(split, batch_size=8, train=True, **common), make_loader(split, batch_size=8, train=False, **common)

    data = make_image_folder(tmp_path / "data", train_per_class=8, val_per_class=4, size=24)
    cfg = DataConfig(train_crop_size=16, val_resize_size=18, val_crop_size=16, interpolation="bilinear")
    train = RobustImageFolder(data / "train", transform=train_transform(cfg))
    val = RobustImageFolder(data / "val", transform=eval_transform(18, 16, "bilinear"))
    images = DeviceImageOptions(train_size=16, val_resize_size=18, val_crop_size=16, cache_size=24, hflip=True)
    return (make_loader(train, batch_size=8, train=True, images=images, **common),
            make_loader(val, batch_size=8, train=False, images=images, **common))


@pytest.mark.parametrize("kind", LOADERS)
def test_training_and_evaluation_epochs_never_synchronise_under_sync_debug(kind, tmp_path):
    device = torch.device("cuda")
    train_loader, val_loader = loaders(kind, tmp_path, device)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 3)).to(device)
    task = MulticlassTask(3)
    optimizer = build_optimizer(model.parameters(), OptimConfig(name="sgd", lr=0.01))
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    normalise = Normalize((0.5,) * 3, (0.5,) * 3).to(device)
    settings = StepSettings(device, "fp32", lambda x: x if x.is_floating_point() else normalise(x))
    for epoch in range(2):  # the first epoch warms up (cuDNN, allocator, workers); the second is watched
        train_loader.set_epoch(epoch)
        running = RunningMeter(device)
        batches = iter(train_loader)
        with syncs_are_errors():
            for inputs, targets in batches:
                inputs, targets = settings.to_device(inputs, targets)
                loss, logits = train_step(model, task, optimizer, scaler, settings, inputs, targets)
                running.update(loss, task.correct(logits, targets), targets.shape[0])
        assert running.count == len(train_loader) * 8
        val_loader.set_epoch(0)
        meter = task.meter(device, confusion=True)
        model.eval()
        with syncs_are_errors(), torch.inference_mode():
            for inputs, targets in val_loader:
                inputs, targets = settings.to_device(inputs, targets)
                logits = model(inputs)
                meter.update(logits, targets, task.eval_loss(logits, targets))
        model.train()
        assert meter.compute()["samples"] > 0
