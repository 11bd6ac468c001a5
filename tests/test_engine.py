"""The training engine end to end on tiny data: run directory, resume, stop, NaN, early stop, options.

Only the tests about Inception v3 itself train it; the engine's behaviour is the same for every
model, so the rest train the guide's small CIFAR-10 CNN at 32 px (~30x fewer FLOPs than Inception
at 75 px).
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from conftest import FAST, ONE_THREAD, make_image_folder
from torch import nn
from torch.nn import functional as F

from inceptionlab.checkpoint import load_checkpoint
from inceptionlab.config import load_recipe
from inceptionlab.engine import fit as engine_fit
from inceptionlab.engine import session as engine_session
from inceptionlab.engine.fit import StopSignal, fit
from inceptionlab.errors import UserError

RECIPE = "inception_v3/imagefolder"
SMALL_CNN = ["model.name=cifar10_cnn", "data.train_crop_size=32", "data.val_resize_size=32", "data.val_crop_size=32"]


def recipe_for(data, *extra):
    return load_recipe(RECIPE, [*FAST, f"data.root={data}", *extra])


def small_recipe_for(data, *extra):
    """The same recipe with the small CNN in place of Inception v3."""
    return recipe_for(data, *SMALL_CNN, *extra)


def state_of(path):
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.mark.slow  # Inception v3's 94 conv shapes: oneDNN kernel creation dominates 2 tiny epochs
def test_run_directory_has_everything(image_folder, tmp_path):
    # Two batch shapes in all (train 6, eval and prediction plot 9): each new shape makes oneDNN create
    # kernels for Inception's 94 convolutions again, which costs more than these tiny steps.
    outcome = fit(recipe_for(image_folder, "train.batch_size=6", "train.eval_batch_size=9"), tmp_path / "runs",
                  progress=False)
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
    recipe = small_recipe_for(data, "train.epochs=1", "train.eval_batch_size=2")
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
    straight = fit(small_recipe_for(image_folder, ONE_THREAD), tmp_path / "a", progress=False)

    stop = StopSignal()

    def request_stop_at(step, loss):
        if step == 2 and stop_epoch[0] == 2:
            stop.request()

    stop_epoch = [0]

    def track(step, loss):
        if step == 1:
            stop_epoch[0] += 1
        request_stop_at(step, loss)

    stopped = fit(small_recipe_for(image_folder, ONE_THREAD), tmp_path / "b", progress=False, stop=stop, on_log=track)
    assert stopped.status == "interrupted"
    ckpt = load_checkpoint(stopped.run_dir / "checkpoints" / "last.pt")
    assert (ckpt["epoch"], ckpt["step_in_epoch"]) == (1, 2)
    assert not (stopped.run_dir / "model.pt").exists()

    capsys.readouterr()
    resumed = fit(small_recipe_for(image_folder, ONE_THREAD), tmp_path / "b", stopped.run_dir, progress=False)
    assert resumed.status == "completed" and resumed.run_dir == stopped.run_dir
    log = capsys.readouterr().out
    # 18 images at batch 4: 4 full steps per epoch (the last partial batch is dropped)
    assert "epoch 2/2 step 3/4" in log and "epoch 2/2 step 4/4" in log and "step 5/" not in log
    a, b = state_of(straight.run_dir / "model.pt"), state_of(resumed.run_dir / "model.pt")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs after resume"
    rows = [json.loads(line) for line in (resumed.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2]


def test_resume_at_epoch_boundary_via_cli(image_folder, tmp_path, cli):
    common = ["--data", image_folder, "--out", tmp_path / "runs", "--no-progress"]
    sets = [x for item in [*FAST, *SMALL_CNN] for x in ("--set", item)]
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
        real_loss_sum = task.loss_sum  # what the loop calls

        def loss_sum(output, targets):
            calls["n"] += 1
            value = real_loss_sum(output, targets)
            return value * float("nan") if calls["n"] > 6 else value  # epoch 1 has 4 steps

        task.loss_sum = loss_sum
        return task

    monkeypatch.setattr(engine_session, "make_task", poisoned)
    with pytest.raises(UserError) as err:
        fit(small_recipe_for(image_folder), tmp_path / "runs", progress=False)
    assert "diverged" in str(err.value) and "nan" in str(err.value) and err.value.exit_code == 3
    run = next((tmp_path / "runs").glob("*/*/*"))
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    assert ckpt["epoch"] == 1
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values() if v.is_floating_point())
    assert not (run / "model.pt").exists()


def test_early_stopping(image_folder, tmp_path):
    recipe = small_recipe_for(image_folder, "train.epochs=5", "train.early_stop_patience=1",
                              "train.early_stop_min_delta=10.0", "data.max_train_samples=8")
    outcome = fit(recipe, tmp_path / "runs", progress=False)
    assert outcome.status == "early_stopped" and outcome.summary["epochs_done"] == 2
    assert outcome.summary["best"]["epoch"] == 1


def test_training_learns_the_tiny_task(tmp_path):
    data = make_image_folder(tmp_path / "d", train_per_class=12, val_per_class=4)
    # The BN-free small CNN: batch-norm statistics from 72 images in batches of 6 made resnet18's
    # validation score a coin toss; this checks that the engine learns, not BN.
    recipe = small_recipe_for(data, "train.epochs=8", "train.batch_size=6", "optim.name=adamw",
                        "optim.lr=0.003", "optim.weight_decay=0.0", "data.train_crop_scale=[0.5,1.0]")
    outcome = fit(recipe, tmp_path / "runs", progress=False)
    assert outcome.summary["best"]["top1"] >= 0.9  # chance is 1/3; seeds 0, 1, 2 all reach 1.0


@pytest.fixture
def built(monkeypatch):
    """The TrainingSession that `fit` builds, kept for inspection, plus what its training steps did.

    `dtypes`: the output dtypes of every Conv2d/Linear in training forwards (autocast's effect);
    `conv_inputs_channels_last`: whether each training input reached the first conv as NHWC;
    `scaled`: loss.scale(loss) / loss per step (the GradScaler's factor).
    """
    seen = SimpleNamespace(session=None, dtypes=set(), conv_inputs_channels_last=set(), scaled=[])
    real_build = engine_fit.build_training_session

    def record_dtype(module, inputs, output):
        if module.training:
            seen.dtypes.add(output.dtype)

    def record_layout(module, inputs):
        if module.training:
            seen.conv_inputs_channels_last.add(inputs[0].is_contiguous(memory_format=torch.channels_last))

    def build(recipe):
        s = real_build(recipe)
        seen.session = s
        if not s.recipe.train.compile:  # hooks would be traced into the compiled graph (`auto` resolved by now)
            for module in s.model.modules():
                if isinstance(module, (nn.Conv2d, nn.Linear)):
                    module.register_forward_hook(record_dtype)
            next(m for m in s.model.modules() if isinstance(m, nn.Conv2d)).register_forward_pre_hook(record_layout)
        real_scale = s.scaler.scale

        def scale(loss):
            scaled = real_scale(loss)
            seen.scaled.append(float(scaled.detach()) / float(loss.detach()))
            return scaled

        s.scaler.scale = scale
        return s

    monkeypatch.setattr(engine_fit, "build_training_session", build)
    return seen


def convs(model):
    return [m for m in model.modules() if isinstance(m, nn.Conv2d)]


@pytest.fixture
def restore_determinism():
    """train.deterministic switches PyTorch's process-wide flag on: switch it back for later tests."""
    before = torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(before)


def test_a_later_run_does_not_inherit_deterministic_mode(restore_determinism):
    from inceptionlab.runtime import seed_everything

    seed_everything(0, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()
    seed_everything(0, deterministic=False)  # the next run in the same process
    assert not torch.are_deterministic_algorithms_enabled()


def test_seeding_leaves_an_unchanged_flag_alone(monkeypatch, restore_determinism):
    """Setting the flag imports torch._inductor (~1.8 s), which must stay in the background import."""
    from inceptionlab.runtime import seed_everything

    torch.use_deterministic_algorithms(False)
    calls = []
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda *a, **k: calls.append(a))
    seed_everything(0, deterministic=False)
    assert calls == []
    seed_everything(0, deterministic=True)
    assert calls == [(True,)]


def test_bf16_and_channels_last_take_effect(image_folder, tmp_path, built):
    recipe = small_recipe_for(image_folder, "train.epochs=1", "train.precision=bf16", "train.channels_last=true")
    assert fit(recipe, tmp_path / "runs", progress=False).status == "completed"
    s = built.session
    assert built.dtypes == {torch.bfloat16}  # every conv and linear ran under bf16 autocast
    assert all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs(s.model))
    assert not any(c.weight.is_contiguous() for c in convs(s.model))  # NHWC, not NCHW
    assert built.conv_inputs_channels_last == {True}  # inputs prepared as NHWC too
    # bf16 needs no loss scaling: the scaler is off and the step never calls it (loop.train_step).
    assert not s.scaler.is_enabled() and built.scaled == []


def test_fp16_uses_the_grad_scaler(image_folder, tmp_path, built):
    recipe = small_recipe_for(image_folder, "train.epochs=1", "train.precision=fp16")
    assert fit(recipe, tmp_path / "runs", progress=False).status == "completed"
    assert built.dtypes == {torch.float16}
    assert built.session.scaler.is_enabled()
    # The loss is multiplied by GradScaler's initial 2**16 before backward (halved only after an inf step).
    assert len(built.scaled) == 4 and built.scaled[0] == 2.0**16 and all(f >= 2.0**10 for f in built.scaled)


def test_adamw_cosine_warmup_smoothing_clip_and_determinism_take_effect(image_folder, tmp_path, built, monkeypatch,
                                                                         restore_determinism):
    clips = []  # (norm before, norm after) per step
    real_clip = torch.nn.utils.clip_grad_norm_

    def clip(parameters, max_norm, *args, **kwargs):
        parameters = list(parameters)
        before = real_clip(parameters, max_norm, *args, **kwargs)
        after = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in parameters]))
        clips.append((float(before), float(after)))
        return before

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    torch.use_deterministic_algorithms(False)
    recipe = small_recipe_for(image_folder, "train.epochs=2", "optim.name=adamw", "optim.lr=0.001",
                              "schedule.name=cosine", "schedule.warmup_epochs=1", "train.label_smoothing=0.1",
                              "train.grad_clip_norm=0.05", "train.deterministic=true")
    outcome = fit(recipe, tmp_path / "runs", progress=False)
    assert outcome.status == "completed"
    s = built.session
    assert isinstance(s.optimizer, torch.optim.AdamW)
    # Warm-up epoch at warmup_start_factor (0.1) x lr, then cosine over the 1 remaining epoch from lr.
    rows = [json.loads(line) for line in (outcome.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in rows] == pytest.approx([1e-4, 1e-3], rel=1e-9)
    # Label smoothing: a confident, correct prediction still costs something (plain cross-entropy: ~0).
    targets = torch.tensor([0, 1, 2])
    perfect = 50.0 * F.one_hot(targets, 3).float()
    assert float(s.task.loss(perfect, targets)) > 1.0 and float(F.cross_entropy(perfect, targets)) < 1e-6
    # Clipping: every step clipped the global gradient norm to 0.05, and there was something to clip.
    assert len(clips) == 8  # 2 epochs x 4 full steps
    assert all(after <= 0.05 * (1 + 1e-4) for _, after in clips)
    assert max(before for before, _ in clips) > 0.05
    assert torch.are_deterministic_algorithms_enabled()
    assert built.dtypes == {torch.float32}  # fp32: no autocast
    assert not built.session.scaler.is_enabled() and built.scaled == []  # and no scaler
    assert built.conv_inputs_channels_last == {False}
    assert all(c.weight.is_contiguous() for c in convs(s.model))  # default NCHW


def test_compile_option_trains_through_the_compiled_module(image_folder, tmp_path, built, monkeypatch):
    """One wrapper per stage, built by the stage: the session also built one that nothing called (under
    torchrun, a second DistributedDataParallel with its own buckets and hooks on every parameter)."""
    wrappers = []
    real_compile = torch.compile

    def compile_and_keep(module, *args, **kwargs):
        wrappers.append(real_compile(module, *args, **kwargs))
        return wrappers[-1]

    monkeypatch.setattr(torch, "compile", compile_and_keep)
    recipe = small_recipe_for(image_folder, "train.epochs=1", "train.compile=true",
                              "data.max_train_samples=8", "data.max_val_samples=4")
    outcome = fit(recipe, tmp_path / "runs", progress=False)
    assert outcome.status == "completed"
    s = built.session
    (runner,) = wrappers
    assert isinstance(runner, torch._dynamo.eval_frame.OptimizedModule) and runner._orig_mod is s.model
    assert "0.weight" in state_of(outcome.run_dir / "model.pt")  # saved from the plain module, no _orig_mod.


def test_aux_logits_loss_is_weighted_by_model_aux_loss_weight(image_folder):
    """Inception v3's aux head (kept when model.aux_loss_weight is set): loss == main + w * aux."""
    # init_weights=false: skip torchvision's truncated-normal init of 27M weights (values do not matter here).
    recipe = recipe_for(image_folder, "model.aux_loss_weight=0.3", "data.train_crop_size=299",
                        "model.kwargs.init_weights=false")
    s = engine_session.build_training_session(recipe)
    assert s.model.AuxLogits is not None and s.model.AuxLogits.fc.out_features == 3
    torch.manual_seed(0)
    images, targets = torch.rand(2, 3, 299, 299), torch.tensor([0, 2])  # the aux head needs 299 px
    with torch.no_grad():
        output = s.model.train()(s.settings.prepare((images * 255).to(torch.uint8)))
    main = F.cross_entropy(output.logits, targets)
    aux = F.cross_entropy(output.aux_logits, targets)
    assert float(s.task.loss(output, targets)) == pytest.approx(float(main + 0.3 * aux), rel=1e-6)
    assert abs(float(aux - main)) > 1e-3  # the two heads differ, so the weight is really tested


def test_empty_class_folder_is_an_error(image_folder, tmp_path):
    (image_folder / "train" / "empty").mkdir()
    with pytest.raises(UserError, match="empty.*no images"):
        fit(small_recipe_for(image_folder), tmp_path / "runs", progress=False)


def test_train_val_class_mismatch_is_an_error(image_folder, tmp_path):
    shutil.rmtree(image_folder / "val" / "fox")
    with pytest.raises(UserError, match="only in train: fox"):
        fit(small_recipe_for(image_folder), tmp_path / "runs", progress=False)


def test_corrupt_and_non_image_files_are_skipped_and_reported(image_folder, tmp_path, capsys):
    (image_folder / "train" / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (image_folder / "train" / "dog" / "notes.txt").write_text("not an image")
    outcome = fit(small_recipe_for(image_folder, "train.epochs=1"), tmp_path / "runs", progress=False)
    out = capsys.readouterr().out
    assert outcome.status == "completed"
    assert any(p.endswith("broken.jpg") for p in outcome.summary["skipped_files"])
    assert "ignored 1 non-image file" in out and "skipped 1 unreadable image" in out


def test_missing_data_folder_is_a_one_line_cli_error(tmp_path, cli):
    result = cli("train", RECIPE, "--data", tmp_path / "nope", "--out", tmp_path / "runs", "--no-progress")
    assert result.code == 2
    assert result.err.startswith("error: ") and str(tmp_path / "nope") in result.err
    assert len(result.err.strip().splitlines()) == 1


def test_background_imports_load_modules_and_leave_missing_ones_to_their_use(monkeypatch):
    import sys
    import threading

    from inceptionlab.engine.session import BACKGROUND_IMPORTS, _import_in_background

    assert "torch._dynamo" in BACKGROUND_IMPORTS  # every torch.optim optimizer imports it
    errors = []
    monkeypatch.setattr(threading, "excepthook", errors.append)
    sys.modules.pop("colorsys", None)
    _import_in_background(("inceptionlab_no_such_module", "colorsys")).join()
    assert errors == [] and "colorsys" in sys.modules


def test_epoch_throughput_leaves_out_the_first_steps_one_off_costs():
    """A slow first step (kernel search, oneDNN primitive creation) must not drag the reported img/s."""
    import time as time_module

    from inceptionlab.engine.loop import StepSettings, train_one_epoch
    from inceptionlab.engine.task import make_task

    class SlowFirstCall(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear, self.calls = nn.Linear(4, 2), 0

        def forward(self, x):
            self.calls += 1
            if self.calls == 1:
                time_module.sleep(0.5)  # stands for a one-off cost, not for synchronisation
            return self.linear(x)

    model = SlowFirstCall()
    batches = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(5)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    result = train_one_epoch(model, batches, make_task("multiclass", 2), optimizer,
                             torch.amp.GradScaler("cpu", enabled=False), StepSettings(torch.device("cpu")))
    assert result.samples == 40 and result.steady_samples == 32
    # The steady window starts after the first step: its 0.5 s is in `seconds` only (a ratio of
    # img/s would depend on how busy the machine is; which time the window holds does not).
    assert result.seconds - result.steady_seconds >= 0.5
    assert result.images_per_s == result.steady_samples / result.steady_seconds
