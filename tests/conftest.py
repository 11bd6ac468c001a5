"""Shared fixtures: run the CLI in-process, small datasets the tests write, the real data in ../shared/data."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("INCEPTIONLAB_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(autouse=True, scope="session")
def speed_settings_of_the_suite(tmp_path_factory):
    """`auto` speed settings resolve to fp32, NCHW, eager without timing (INCEPTIONLAB_AUTO=safe), so
    results do not depend on the CPU a test runs on, and measurements never touch the user's cache.
    Tests of `auto` itself set INCEPTIONLAB_AUTO=measure (and a cache of their own)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("INCEPTIONLAB_AUTO", "safe")
        patch.setenv("INCEPTIONLAB_CACHE", str(tmp_path_factory.mktemp("inceptionlab-cache")))
        yield


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys):
    """Run `inceptionlab ARGS...` in-process; returns exit code, stdout and stderr."""
    from inceptionlab.cli.app import main

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def shared_data(name: str) -> Path:
    """Path to a real dataset in ../shared/data, or skip the test with the reason."""
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"real data {path} is absent (set INCEPTIONLAB_SHARED_DATA to its folder)")
    return path


def make_image_folder(root: Path, classes=("cat", "dog", "fox"), train_per_class=6, val_per_class=3, size=40, seed=0) -> Path:
    """A tiny ImageFolder whose classes differ by colour, so a model can learn them in a few steps."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    palette = [(220, 40, 40), (40, 200, 60), (50, 70, 230), (230, 220, 40), (200, 60, 220)]
    for split, count in (("train", train_per_class), ("val", val_per_class)):
        for c, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                noise = rng.integers(-40, 40, size=(size, size, 3))
                pixels = np.clip(np.array(palette[c % len(palette)]) + noise, 0, 255).astype("uint8")
                Image.fromarray(pixels).save(folder / f"{name}_{i}.png")
    return root


@pytest.fixture
def image_folder(tmp_path) -> Path:
    return make_image_folder(tmp_path / "data")


# Two runs compared bit for bit (resume against an uninterrupted run, one loader against another) need one
# thread count in both: training follows other processes' load (hardware.ThreadGovernor), and in a bare
# `pytest -n 2` (`make test` pins OMP_NUM_THREADS=1) one run switched to 1 thread beside the other worker
# and summed its reductions in another order.
ONE_THREAD = "train.threads=1"

# Fast settings shared by engine tests: Inception v3's smallest input (75 px), tiny batches, main-process loading.
# A small random model trained whole (inception_v3/imagefolder is a linear probe of trained weights by default,
# which refuses a random body): every layer at one rate, no label smoothing, a constant rate over the epochs.
FAST = [
    "model.weights=null",
    "finetune.body_lr_mult=1",
    "train.label_smoothing=0.0",
    "schedule.name=steplr",
    "data.train_crop_size=75",
    "data.val_resize_size=75",
    "data.val_crop_size=75",
    "data.num_workers=0",
    "train.batch_size=4",
    "train.epochs=2",
    "train.log_every=1",
    "optim.lr=0.01",
]


@dataclass(frozen=True)
class TrainedRun:
    run_dir: Path  # a finished run directory (model.pt, spec.json, summary.json, plots, ...)
    data: Path  # the ImageFolder it was trained on: train/ and val/ with classes cat, dog, fox


@pytest.fixture(scope="session")
def _squares_run_once(tmp_path_factory) -> TrainedRun:
    """resnet18 trained for 2 epochs on coloured squares at 75 px, once per test session.

    The inference tests (predict, evaluate, export, bench, runtimes) need a real run directory
    whose model has learnt something (int8 agreement needs clear margins); training it once instead
    of once per file saves four trainings (one took 190 s on the shared 2-core machine at load 11).
    """
    from inceptionlab.config import load_recipe
    from inceptionlab.engine.fit import fit

    root = tmp_path_factory.mktemp("squares_run")
    data = make_image_folder(root / "data")
    recipe = load_recipe("inception_v3/imagefolder", [*FAST, f"data.root={data}", "model.name=resnet18"])
    return TrainedRun(fit(recipe, root / "runs", progress=False).run_dir, data)


@pytest.fixture(scope="module")
def squares_run(_squares_run_once, tmp_path_factory) -> TrainedRun:
    """A private copy of the session's trained run for each test module.

    Commands write into a run directory (exports/, bench/, eval/, plots/): a copy per module keeps
    one file's outputs from changing what another file sees. Checkpoints and TensorBoard events are
    left out (171 MB: resnet18 weights + momentum, twice); inference reads model.pt.
    """
    source = _squares_run_once.run_dir
    copy = tmp_path_factory.mktemp("run_copy") / source.name
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("checkpoints", "tb"))
    return TrainedRun(copy, _squares_run_once.data)


@pytest.fixture(scope="session")
def inception_hub(tmp_path_factory):
    """A torch hub cache holding a file named like torchvision's Inception v3 ImageNet weights.

    The values are random (real weights cannot be downloaded here): enough to test loading,
    head replacement and labels, not accuracy.
    """
    import torch
    import torchvision

    from inceptionlab.models.registry import cached_weights_file

    hub = tmp_path_factory.mktemp("torch_home") / "hub"
    previous = torch.hub.get_dir()
    torch.hub.set_dir(str(hub))
    model = torchvision.models.inception_v3(weights=None, aux_logits=True, init_weights=False)
    target = cached_weights_file("inception_v3")
    target.parent.mkdir(parents=True)
    torch.save(model.state_dict(), target)
    yield {"dir": hub, "state": model.state_dict()}
    torch.hub.set_dir(previous)


@pytest.fixture(scope="session")
def cifar_root(tmp_path_factory) -> Path:
    """cifar-10-batches-py in the original pickle format: 150 train and 50 test images, classes by colour
    (helpers/datasets.py)."""
    from helpers.datasets import write_cifar10

    return write_cifar10(tmp_path_factory.mktemp("cifar")) / "cifar-10-batches-py"


@pytest.fixture(scope="session")
def fashion_root(tmp_path_factory) -> Path:
    """Fashion-MNIST's four idx .gz files: 300 train and 100 test 28x28 images, classes by pattern."""
    from helpers.datasets import write_idx_dataset

    return write_idx_dataset(tmp_path_factory.mktemp("fashion"))


@pytest.fixture(scope="session")
def imdb_root(tmp_path_factory) -> Path:
    """A folder holding aclImdb/ with 24 reviews per label and split, positive and negative by their words."""
    from helpers.datasets import write_aclimdb

    return write_aclimdb(tmp_path_factory.mktemp("imdb"))


@pytest.fixture(scope="session")
def sample_photos(tmp_path_factory) -> Path:
    """dog.jpg, cat.jpg and eagle.jpg: camera-sized JPEGs (not real photos) for the predict paths."""
    from helpers.datasets import write_photos

    return write_photos(tmp_path_factory.mktemp("photos"))


@pytest.fixture
def one_cpu_thread():
    """Run the test's torch work on one CPU thread, then restore the thread count.

    On the shared 2-core test machine two OpenMP threads spin-wait on each other under load:
    measured at load 13, a digits CNN step took 0.5 s on 2 threads and 0.04 s on 1, and a 2-step
    Inception v3 fit at 299 px took 90 s against 28 s.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
