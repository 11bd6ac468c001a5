"""`--resume`: bit-exact with loader workers, and `--set` on resume applied, or refused before anything is written."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FAST, ONE_THREAD

from inceptionlab.checkpoint import load_checkpoint
from inceptionlab.config import load_recipe
from inceptionlab.data.datasets.imagefolder import RobustImageFolder
from inceptionlab.data.loading.loaders import make_loader
from inceptionlab.data.transforms.host import train_transform
from inceptionlab.engine.fit import StopSignal, fit
from inceptionlab.models.registry import resolve_data_config

RECIPE = "inception_v3/imagefolder"
SMALL_CNN = ["model.name=cifar10_cnn", "data.train_crop_size=32", "data.val_resize_size=32", "data.val_crop_size=32"]
WORKERS = ["data.loader=workers", "data.num_workers=2", "data.hflip=true", ONE_THREAD]


def small_recipe(data, *extra):
    return load_recipe(RECIPE, [*FAST, *SMALL_CNN, f"data.root={data}", *extra])


def worker_batches(split, epoch, start=0, loader=None):
    loader = loader or make_loader(split, batch_size=4, train=True, seed=5, num_workers=2, mode="workers")
    loader.set_epoch(epoch, start)
    return loader, [inputs for inputs, _ in loader]


def test_a_fresh_worker_loader_mid_epoch_draws_what_a_long_running_one_draws(image_folder):
    """Persistent workers were seeded once per loader, and a resumed process hands samples to other
    workers: each sample's crop and flip now come from (seed, epoch, index) alone."""
    cfg = resolve_data_config(small_recipe(image_folder, *WORKERS).data, "cifar10_cnn")
    split = RobustImageFolder(image_folder / "train", transform=train_transform(cfg))
    loader, _ = worker_batches(split, 0)
    _, straight = worker_batches(split, 1, loader=loader)  # the same workers, a second epoch
    _, resumed = worker_batches(split, 1, start=8)  # a new process: new workers, two batches in
    assert len(straight) == len(resumed) + 2
    for a, b in zip(straight[2:], resumed):
        assert torch.equal(a, b)


def test_ctrl_c_early_in_epoch_two_then_resume_with_two_workers_is_bit_exact(image_folder, tmp_path):
    straight = fit(small_recipe(image_folder, *WORKERS), tmp_path / "a", progress=False)

    stop, epochs_seen = StopSignal(), []

    def ctrl_c_at_step_one_of_epoch_two(step, loss):
        if step == 1:
            epochs_seen.append(step)
            if len(epochs_seen) == 2:
                stop.request()

    stopped = fit(small_recipe(image_folder, *WORKERS), tmp_path / "b", progress=False, stop=stop,
                  on_log=ctrl_c_at_step_one_of_epoch_two)
    assert stopped.status == "interrupted"
    ckpt = load_checkpoint(stopped.run_dir / "checkpoints" / "last.pt")
    assert (ckpt["epoch"], ckpt["step_in_epoch"]) == (1, 1)
    resumed = fit(small_recipe(image_folder, *WORKERS), tmp_path / "b", stopped.run_dir, progress=False)
    assert resumed.status == "completed"
    a = torch.load(straight.run_dir / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(resumed.run_dir / "checkpoints" / "last.pt", weights_only=True)
    tensors = [(part, key) for part in ("model",) for key in a[part]]
    tensors += [("optimizer", (index, name)) for index, state in a["optimizer"]["state"].items() for name in state]
    assert len(tensors) > 10
    for part, key in tensors:
        if part == "model":
            assert torch.equal(a["model"][key], b["model"][key]), key
        else:
            index, name = key
            assert torch.equal(a["optimizer"]["state"][index][name], b["optimizer"]["state"][index][name]), key


# --- --set on --resume -------------------------------------------------------------------------------


def sets(*items):
    return [x for item in items for x in ("--set", item)]


@pytest.fixture
def adam_run(image_folder, tmp_path, cli):
    """One finished epoch of an Adam run (constant schedule, lr 0.001)."""
    common = ["--data", image_folder, "--out", tmp_path / "runs", "--no-progress", "--json"]
    done = cli("train", RECIPE, *common, *sets(*FAST, *SMALL_CNN, "train.epochs=1", "optim.name=adam",
                                               "optim.lr=0.001", "schedule.name=constant"))
    assert done.code == 0, done.err
    from pathlib import Path

    return Path(json.loads(done.out.strip().splitlines()[-1])["run_dir"])


def test_an_lr_and_epochs_override_on_resume_is_applied_and_said(adam_run, cli):
    result = cli("train", "--resume", adam_run, "--no-progress", *sets("optim.lr=0.004", "train.epochs=2"))
    assert result.code == 0, result.err
    assert "optim.lr 0.001 -> 0.004" in result.out and "train.epochs 1 -> 2" in result.out
    rows = [json.loads(line) for line in (adam_run / "metrics.jsonl").read_text().splitlines()]
    assert [row["lr"] for row in rows] == [pytest.approx(0.001), pytest.approx(0.004)]
    assert "lr: 0.004" in (adam_run / "recipe.resolved.yaml").read_text()
    ckpt = load_checkpoint(adam_run / "checkpoints" / "last.pt")
    assert ckpt["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.004)


@pytest.mark.parametrize("change", ["optim.name=sgd", "model.name=resnet18", "data.val_crop_size=28",
                                    "train.batch_size=2", "optim.weight_decay=0.1"])
def test_an_override_the_checkpoint_cannot_take_is_refused_before_anything_is_written(adam_run, cli, change):
    before = {path: path.read_bytes() for path in adam_run.rglob("*") if path.is_file()}
    refused = cli("train", "--resume", adam_run, "--no-progress", *sets(change, "train.epochs=2"))
    assert refused.code == 2
    key = change.split("=")[0]
    lines = refused.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0] and "Traceback" not in refused.err
    after = {path: path.read_bytes() for path in adam_run.rglob("*") if path.is_file()}
    assert after == before
    # The run is intact: a plain resume later still works.
    again = cli("train", "--resume", adam_run, "--no-progress", *sets("train.epochs=2"))
    assert again.code == 0, again.err
    assert [json.loads(line)["epoch"] for line in (adam_run / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_resuming_a_finished_run_without_more_epochs_says_how_to_extend_it(adam_run, cli):
    summary = (adam_run / "summary.json").read_bytes()
    result = cli("train", "--resume", adam_run, "--no-progress")
    assert result.code == 2 and "train.epochs" in result.err
    assert (adam_run / "summary.json").read_bytes() == summary
