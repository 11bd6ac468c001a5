"""What `train` says when things go other than planned: Ctrl-C early, a resume with nothing to resume,
a bad --set, a run that diverges at once, missing pretrained weights. Each message names what
happened and what to do; the guide's small CIFAR-10 CNN at 32 px keeps the runs short."""

from __future__ import annotations

import json
import urllib.error
from pathlib import Path

import pytest
import torch
from conftest import FAST
from helpers.page_examples import check_example

from inceptionlab.engine import artifacts as engine_artifacts
from inceptionlab.engine import session as engine_session

RECIPE = "inception_v3/imagefolder"
SMALL_CNN = ["model.name=cifar10_cnn", "data.train_crop_size=32", "data.val_resize_size=32", "data.val_crop_size=32"]


def train_args(data: Path, out: Path, *extra: str) -> list:
    sets = [x for item in [*FAST, *SMALL_CNN, "train.epochs=1", *extra] for x in ("--set", item)]
    return ["train", RECIPE, "--data", data, "--out", out, "--no-progress", *sets]


def test_ctrl_c_while_the_first_batch_is_prepared_says_what_to_do(image_folder, tmp_path, cli, monkeypatch):
    def interrupted(self, s):
        raise KeyboardInterrupt

    monkeypatch.setattr(engine_artifacts.RunArtifacts, "_plot_first_batch", interrupted)
    result = cli(*train_args(image_folder, tmp_path / "runs"))
    assert result.code == 130
    run_dir = next((tmp_path / "runs").glob("*/*/*"))
    assert "interrupted while preparing the data" in result.err and "no checkpoint" in result.err
    assert f"inceptionlab train {run_dir / 'recipe.resolved.yaml'}" in result.err
    monkeypatch.undo()
    again = cli("train", "--resume", run_dir, "--no-progress")
    assert again.code == 2
    assert "no checkpoint to resume" in again.err and f"inceptionlab train {run_dir / 'recipe.resolved.yaml'}" in again.err
    assert "checkpoint not found" not in again.err


def test_ctrl_c_while_the_data_is_read_says_nothing_was_written(image_folder, tmp_path, cli, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(engine_session, "read_splits", interrupted)
    result = cli(*train_args(image_folder, tmp_path / "runs"))
    assert result.code == 130
    assert "interrupted while reading the data" in result.err and "nothing was written" in result.err
    assert not list((tmp_path / "runs").glob("*/*/*"))


def test_a_bad_set_value_is_blamed_on_the_set(image_folder, tmp_path, cli):
    result = cli(*train_args(image_folder, tmp_path / "runs", "train.epochs=-1"))
    assert result.code == 2
    assert result.err.startswith("error: --set train.epochs=-1: ") and ".yaml" not in result.err
    choice = cli(*train_args(image_folder, tmp_path / "runs", "optim.name=adamx"))
    assert choice.err.startswith("error: --set optim.name=adamx: ") and "sgd" in choice.err


def test_resume_does_not_say_random_init(image_folder, tmp_path, cli):
    first = cli(*train_args(image_folder, tmp_path / "runs"), "--json")
    assert first.code == 0, first.err
    assert "weights: random init" in first.out
    run_dir = json.loads(first.out.strip().splitlines()[-1])["run_dir"]
    more = cli("train", "--resume", run_dir, "--set", "train.epochs=2", "--no-progress")
    assert more.code == 0, more.err
    assert "random init" not in more.out and "weights: resumed from" in more.out


def test_ctrl_c_before_the_first_epoch_ends_does_not_print_epoch_none(image_folder, tmp_path, cli, monkeypatch):
    from inceptionlab.engine import fit as engine_fit

    real = engine_fit.agree_at_log

    def stop_at_once(loss, stop, info, device):  # a Ctrl-C at the first log point
        return real(loss, True, info, device)

    monkeypatch.setattr(engine_fit, "agree_at_log", stop_at_once)
    result = cli(*train_args(image_folder, tmp_path / "runs"))
    assert result.code == 130
    assert "epoch None" not in result.out and "no epoch finished" in result.out


def test_a_run_that_diverges_in_epoch_one_says_no_checkpoint_and_records_its_status(image_folder, tmp_path, monkeypatch):
    from inceptionlab.config import load_recipe
    from inceptionlab.engine.fit import fit
    from inceptionlab.errors import UserError

    real_make_task = engine_session.make_task

    def poisoned(*args, **kwargs):
        task = real_make_task(*args, **kwargs)
        real_loss_sum = task.loss_sum  # what a training step calls (the task owns the normalisation)
        task.loss_sum = lambda output, targets: real_loss_sum(output, targets) * float("nan")
        return task

    monkeypatch.setattr(engine_session, "make_task", poisoned)
    recipe = load_recipe(RECIPE, [*FAST, *SMALL_CNN, f"data.root={image_folder}"])
    with pytest.raises(UserError) as err:
        fit(recipe, tmp_path / "runs", progress=False)
    run = next((tmp_path / "runs").glob("*/*/*"))
    assert "diverged in epoch 1" in str(err.value) and "kept the last good checkpoint" not in str(err.value)
    assert "no checkpoint was saved" in str(err.value)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["epochs_done"] is None
    assert not (run / "model.pt").exists()


def test_missing_pretrained_weights_tell_train_users_the_recipe_key(image_folder, tmp_path, cli, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    result = cli(*train_args(image_folder, tmp_path / "runs", "model.name=resnet18", "model.weights=imagenet"))
    assert result.code == 2
    assert "--set model.weights=PATH" in result.err


def test_a_text_run_counts_samples_not_images(imdb_root, tmp_path, cli):
    result = cli("train", "imdb/text_classifier", "--data", imdb_root, "--set", "train.epochs=1",
                 "--out", tmp_path / "runs", "--no-progress")
    assert result.code == 0, result.err
    line = next(line for line in result.out.splitlines() if "train_loss" in line)
    assert "samples/s" in line and "img/s" not in line


def test_ctrl_c_in_any_other_command_says_interrupted(sample_photos, cli, monkeypatch):
    from inceptionlab.infer import predict

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(predict.Predictor, "predict_files", interrupted)
    result = cli("predict", sample_photos, "--model", "squeezenet1_1", "--weights", "random")
    assert result.code == 130 and result.err.strip() == "interrupted"


def test_a_fine_tune_from_a_weights_file_then_from_its_run_says_what_it_loaded_and_when_the_body_unfreezes(
        tmp_path, cli):
    """The fine-tuning page's two examples: head first from a torchvision weights file (1000 classes), then a
    run continued on a folder that adds a class, its head's rows carried over by name."""
    import torchvision
    from conftest import make_image_folder

    torch.save(torchvision.models.resnet18().state_dict(), tmp_path / "resnet18.pt")
    photos = make_image_folder(tmp_path / "photos", train_per_class=4, val_per_class=2)
    resnet = ["model.name=resnet18", "data.train_crop_size=32", "data.val_resize_size=32", "data.val_crop_size=32"]
    sets = [x for item in [*FAST, *resnet, f"model.weights={tmp_path / 'resnet18.pt'}", "train.epochs=3",
                           "finetune.freeze_epochs=2", "schedule.warmup_epochs=1", "ema.decay=0.999",
                           "finetune.body_lr_mult=0.08", "train.log_every=100"] for x in ("--set", item)]
    first = cli("train", RECIPE, "--data", photos, "--out", tmp_path / "runs", "--no-progress", *sets)
    assert first.code == 0, first.err
    check_example("fine-tuning-train", first.out, labels=["cat", "dog", "fox"])
    run = next((tmp_path / "runs").glob("*/*/*"))
    more = make_image_folder(tmp_path / "more", classes=("cat", "dog", "fox", "owl"), train_per_class=2, val_per_class=1)
    again = cli("train", RECIPE, "--data", more, "--out", tmp_path / "runs", "--no-progress",
                # lr 0.001: at the recipe's 0.1 (and at 0.01) one epoch on 8 photos explodes the validation loss
                *[x for item in [*FAST, *resnet, f"model.weights={run}", "train.epochs=1", "train.log_every=100",
                                 "optim.lr=0.001"] for x in ("--set", item)])
    assert again.code == 0, again.err
    check_example("fine-tuning-continue", again.out, labels=["cat", "dog", "fox", "owl"])


# Values that cannot work together, each refused by the one check before any data is read or anything trains:
# (--set values, words the one-line error must hold: the keys, their values and the fix).
CONFLICTS = [
    # Without EMA there are no raw weights beside an average: a whole epoch trained, then a KeyError (exit 70).
    (["train.best_metric=val_raw_top1"], ["train.best_metric=val_raw_top1", "ema.decay", "val_top1"]),
    # Both correct for the imbalance: together each class's share of the loss went as n^-2p, without a word.
    (["data.sampler=balanced", "train.class_weights=auto"],
     ["data.sampler=balanced", "train.class_weights=auto", "train.class_weights=null", "data.sampler=shuffle"]),
]


@pytest.mark.parametrize("sets, named", CONFLICTS)
def test_values_that_cannot_work_together_are_refused_before_any_work(image_folder, tmp_path, cli, sets, named):
    result = cli(*train_args(image_folder, tmp_path / "runs", *sets))
    assert result.code == 2, result.err
    (line,) = result.err.strip().splitlines()
    assert line.startswith(f"error: --set {sets[-1]}: ") and all(word in line for word in named), line
    assert not (tmp_path / "runs").exists()  # nothing written
    from inceptionlab.config import load_recipe
    from inceptionlab.engine.fit import fit
    from inceptionlab.errors import UserError

    # The same check guards the API, before the data is read (this folder does not exist).
    recipe = load_recipe(RECIPE, [*FAST, *SMALL_CNN, f"data.root={tmp_path / 'absent'}", *sets])
    with pytest.raises(UserError, match=named[0].replace(".", r"\.")):
        fit(recipe, tmp_path / "api", progress=False)


def test_listed_class_weights_on_a_balanced_sampler_are_said_to_apply_on_top(image_folder):
    from inceptionlab.config import load_recipe
    from inceptionlab.engine.session import build_training_session

    recipe = load_recipe(RECIPE, [*FAST, *SMALL_CNN, f"data.root={image_folder}", "data.sampler=balanced",
                                  "train.class_weights=[1,2,1]"])
    notes = build_training_session(recipe).notes
    line = next(note for note in notes if note.startswith("class weights:"))
    assert "on top of the balanced sampler" in line
