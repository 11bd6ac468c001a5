"""The training engine end to end on tiny data: run directory, resume, stop, NaN, early stop, options."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import FAST, make_image_folder

from inceptionlab.checkpoint import load_checkpoint
from inceptionlab.config import load_recipe
from inceptionlab.engine import session as engine_session
from inceptionlab.engine.fit import StopSignal, fit
from inceptionlab.errors import UserError

RECIPE = "inception_v3/imagefolder"
SMALL_CNN = ["model.name=cifar10_cnn", "data.train_crop_size=32", "data.val_resize_size=32", "data.val_crop_size=32"]


def recipe_for(data, *extra):
    return load_recipe(RECIPE, [*FAST, f"data.root={data}", *extra])


def state_of(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def test_run_directory_has_everything(image_folder, tmp_path):
    outcome = fit(recipe_for(image_folder), tmp_path / "runs", progress=False)
    run = outcome.run_dir
    assert outcome.status == "completed"
    assert run.parent == tmp_path / "runs" / "inception_v3" / "imagefolder"
    for name in ("recipe.resolved.yaml", "env.json", "spec.json", "metrics.jsonl", "summary.json", "model.pt",
                 "checkpoints/last.pt", "checkpoints/best.pt", "plots/loss.png", "plots/accuracy.png",
                 "plots/confusion.png", "confusion.csv"):
        assert (run / name).is_file(), name
    assert list((run / "tb").glob("events.out.tfevents.*"))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2]
    for key in ("train_loss", "val_loss", "val_top1", "val_top5", "lr", "images_per_s", "epoch_seconds"):
        assert all(key in r for r in rows), key
    assert rows[0]["samples"] == 18  # 3 classes x 6 train images
    summary = json.loads((run / "summary.json").read_text())
    for which in ("best", "last"):
        assert {"loss", "top1", "top5", "per_class"} <= set(summary[which])
        assert set(summary[which]["per_class"]) == {"cat", "dog", "fox"}
        assert 0.0 <= summary[which]["top1"] <= summary[which]["top5"] <= 1.0
    spec = json.loads((run / "spec.json").read_text())
    assert spec["class_names"] == ["cat", "dog", "fox"] and spec["crop_size"] == 75
    # model.pt is a plain state_dict, like the guide's torch.save(model.state_dict(), ...)
    assert "fc.weight" in state_of(run / "model.pt") and state_of(run / "model.pt")["fc.weight"].shape == (3, 2048)


def test_val_loss_is_sample_weighted(tmp_path):
    """7 val images in batches of 2 (the last batch holds 1): the mean must weight by images, not batches."""
    data = make_image_folder(tmp_path / "d", train_per_class=2, val_per_class=2)
    (data / "val" / "fox" / "fox_1.png").unlink()  # 5 val images -> batches of 2, 2, 1
    recipe = recipe_for(data, "train.epochs=1", "train.eval_batch_size=2", "model.name=resnet18")
    outcome = fit(recipe, tmp_path / "runs", progress=False)
    from inceptionlab.models.registry import load_run_model

    model, spec = load_run_model(outcome.run_dir)
    from inceptionlab.data.readers import read_eval_split

    dataset = read_eval_split(recipe.data, spec.eval_transform())
    norm = spec.normalizer()
    with torch.no_grad():
        losses = [torch.nn.functional.cross_entropy(model(norm(torch.as_tensor(x)[None])), torch.tensor([y]))
                  for x, y in dataset]
    expected = float(torch.stack(losses).mean())
    assert outcome.summary["last"]["loss"] == pytest.approx(expected, rel=1e-4)


def test_stop_mid_epoch_then_resume_matches_an_uninterrupted_run(image_folder, tmp_path, capsys):
    straight = fit(recipe_for(image_folder), tmp_path / "a", progress=False)

    stop = StopSignal()

    def request_stop_at(step, loss):
        if step == 2 and stop_epoch[0] == 2:
            stop.request()

    stop_epoch = [0]

    def track(step, loss):
        if step == 1:
            stop_epoch[0] += 1
        request_stop_at(step, loss)

    stopped = fit(recipe_for(image_folder), tmp_path / "b", progress=False, stop=stop, on_log=track)
    assert stopped.status == "interrupted"
    ckpt = load_checkpoint(stopped.run_dir / "checkpoints" / "last.pt")
    assert (ckpt["epoch"], ckpt["step_in_epoch"]) == (1, 2)
    assert not (stopped.run_dir / "model.pt").exists()

    capsys.readouterr()
    resumed = fit(recipe_for(image_folder), tmp_path / "b", stopped.run_dir, progress=False)
    assert resumed.status == "completed" and resumed.run_dir == stopped.run_dir
    log = capsys.readouterr().out
    assert "epoch 2/2 step 3/5" in log and "epoch 2/2 step 5/5" in log and "step 6/" not in log
    a, b = state_of(straight.run_dir / "model.pt"), state_of(resumed.run_dir / "model.pt")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs after resume"
    rows = [json.loads(line) for line in (resumed.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2]


def test_resume_at_epoch_boundary_via_cli(image_folder, tmp_path, cli):
    common = ["--data", image_folder, "--out", tmp_path / "runs", "--no-progress"]
    sets = [x for item in FAST for x in ("--set", item)]
    first = cli("train", RECIPE, *common, *sets, "--set", "train.epochs=1", "--json")
    assert first.code == 0, first.err
    run_dir = json.loads(first.out.strip().splitlines()[-1])["run_dir"]
    more = cli("train", "--resume", run_dir, "--set", "train.epochs=2", "--no-progress", "--json")
    assert more.code == 0, more.err
    summary = json.loads(more.out.strip().splitlines()[-1])
    assert summary["epochs_done"] == 2 and summary["run_dir"] == run_dir


def test_nan_loss_stops_with_a_clear_message_and_keeps_last_good_checkpoint(image_folder, tmp_path, monkeypatch):
    real_make_task = engine_session.make_task

    def poisoned(*args, **kwargs):
        task = real_make_task(*args, **kwargs)
        calls = {"n": 0}
        real_loss = task.loss

        def loss(output, targets):
            calls["n"] += 1
            value = real_loss(output, targets)
            return value * float("nan") if calls["n"] > 6 else value  # epoch 1 has 5 steps

        task.loss = loss
        return task

    monkeypatch.setattr(engine_session, "make_task", poisoned)
    with pytest.raises(UserError) as err:
        fit(recipe_for(image_folder), tmp_path / "runs", progress=False)
    assert "diverged" in str(err.value) and "nan" in str(err.value) and err.value.exit_code == 3
    run = next((tmp_path / "runs").glob("*/*/*"))
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    assert ckpt["epoch"] == 1
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values() if v.is_floating_point())
    assert not (run / "model.pt").exists()


def test_early_stopping(image_folder, tmp_path):
    recipe = recipe_for(image_folder, "train.epochs=5", "train.early_stop_patience=1",
                        "train.early_stop_min_delta=10.0", "model.name=resnet18", "data.max_train_samples=8")
    outcome = fit(recipe, tmp_path / "runs", progress=False)
    assert outcome.status == "early_stopped" and outcome.summary["epochs_done"] == 2
    assert outcome.summary["best"]["epoch"] == 1


def test_training_learns_the_tiny_task(tmp_path):
    data = make_image_folder(tmp_path / "d", train_per_class=12, val_per_class=4)
    # The BN-free small CNN: batch-norm statistics from 72 images in batches of 6 made resnet18's
    # validation score a coin toss; this checks that the engine learns, not BN.
    recipe = recipe_for(data, *SMALL_CNN, "train.epochs=8", "train.batch_size=6", "optim.name=adamw",
                        "optim.lr=0.003", "optim.weight_decay=0.0", "data.train_crop_scale=[0.5,1.0]")
    outcome = fit(recipe, tmp_path / "runs", progress=False)
    assert outcome.summary["best"]["top1"] >= 0.9  # chance is 1/3; seeds 0, 1, 2 all reach 1.0


@pytest.mark.parametrize(
    "settings",
    [
        ["train.precision=bf16", "train.channels_last=true"],
        ["train.precision=fp16"],
        ["optim.name=adamw", "optim.lr=0.001", "schedule.name=cosine", "schedule.warmup_epochs=1",
         "train.label_smoothing=0.1", "train.grad_clip_norm=1.0", "train.deterministic=true"],
    ],
    ids=["bf16-channels_last", "fp16-gradscaler", "adamw-cosine-warmup-smoothing-clip-deterministic"],
)
def test_training_options_run(image_folder, tmp_path, settings):
    # A small CNN: each option's code path is the same for every model; Inception's 94 conv shapes
    # only add oneDNN kernel-creation time (and CPU fp16 kernels are slow) here.
    recipe = recipe_for(image_folder, "train.epochs=1", *SMALL_CNN, *settings)
    outcome = fit(recipe, tmp_path / "runs", progress=False)
    assert outcome.status == "completed"
    assert torch.isfinite(torch.tensor(outcome.summary["last"]["loss"]))


def test_compile_option_runs(image_folder, tmp_path):
    recipe = recipe_for(image_folder, "train.epochs=1", "train.compile=true", *SMALL_CNN,
                        "data.max_train_samples=8", "data.max_val_samples=4")
    outcome = fit(recipe, tmp_path / "runs", progress=False)
    assert outcome.status == "completed"
    assert "0.weight" in state_of(outcome.run_dir / "model.pt")  # saved from the plain module, no _orig_mod.


def test_empty_class_folder_is_an_error(image_folder, tmp_path):
    (image_folder / "train" / "empty").mkdir()
    with pytest.raises(UserError, match="empty.*no images"):
        fit(recipe_for(image_folder), tmp_path / "runs", progress=False)


def test_train_val_class_mismatch_is_an_error(image_folder, tmp_path):
    shutil.rmtree(image_folder / "val" / "fox")
    with pytest.raises(UserError, match="only in train: fox"):
        fit(recipe_for(image_folder), tmp_path / "runs", progress=False)


def test_corrupt_and_non_image_files_are_skipped_and_reported(image_folder, tmp_path, capsys):
    (image_folder / "train" / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (image_folder / "train" / "dog" / "notes.txt").write_text("not an image")
    outcome = fit(recipe_for(image_folder, "train.epochs=1"), tmp_path / "runs", progress=False)
    out = capsys.readouterr().out
    assert outcome.status == "completed"
    assert any(p.endswith("broken.jpg") for p in outcome.summary["skipped_files"])
    assert "ignored 1 non-image file" in out and "skipped 1 unreadable image" in out


def test_missing_data_folder_is_a_one_line_cli_error(tmp_path, cli):
    result = cli("train", RECIPE, "--data", tmp_path / "nope", "--out", tmp_path / "runs", "--no-progress")
    assert result.code == 2
    assert result.err.startswith("error: ") and str(tmp_path / "nope") in result.err
    assert len(result.err.strip().splitlines()) == 1
