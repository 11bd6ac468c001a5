"""Fine-tuning: registry parts, starting weights from a run, head-only epochs (slow and cached-features
paths), the unfreeze under resume, layer-wise rates, no decay on norm and bias, the per-step warm-up."""

from __future__ import annotations

import json
import math

import pytest
from helpers.page_examples import check_example
import torch
import torchvision
from conftest import FAST, ONE_THREAD, make_image_folder

from inceptionlab.config import FinetuneConfig, OptimConfig, ScheduleConfig, load_recipe
from inceptionlab.engine.fit import StopSignal, fit
from inceptionlab.engine.optim import build_optimizer, build_scheduler
from inceptionlab.models.parts import model_parts

SMALL_CNN = ["model.name=cifar10_cnn", "data.train_crop_size=32", "data.val_resize_size=32", "data.val_crop_size=32"]
# resnet18 at 32 px: BatchNorm in the body, for what freezing does to running statistics.
RESNET = ["model.name=resnet18", "data.train_crop_size=32", "data.val_resize_size=32", "data.val_crop_size=32"]


def recipe_for(data, *extra):
    return load_recipe("inception_v3/imagefolder", [*FAST, f"data.root={data}", *extra])


def state_of(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def start_weights(folder, name="cifar10_cnn", classes=3, seed=0):
    """A weights file of a freshly initialised `name` (a body that is not random init to the run: it comes
    from a file, as pretrained weights do), and its state_dict. The head's weights are zero, so the start
    scores chance exactly (every logit equal): a run kept the last epoch's weights unless it scores below."""
    from inceptionlab.models.parts import model_parts
    from inceptionlab.models.registry import build_model

    torch.manual_seed(seed)
    model = build_model(name, classes, None).model
    with torch.no_grad():
        for key in model_parts(model, classes).head:
            model.get_parameter(key).zero_()
    state = model.state_dict()
    path = folder / f"{name}-start.pt"
    torch.save(state, path)
    return path, state


def add_unreadable_jpegs(data, count):
    """`count` files named like JPEGs that no decoder reads, in train/cat."""
    for index in range(count):
        (data / "train" / "cat" / f"broken_{index}.jpg").write_bytes(b"not a jpeg" * 10)


# --------------------------------------------------------------------------- parts from the registry


@pytest.mark.parametrize("name", ["resnet18", "inception_v3", "googlenet", "vit_b_16", "efficientnet_b0", "vgg11",
                                  "convnext_tiny", "squeezenet1_0", "mobilenet_v3_small", "densenet121", "swin_t"])
def test_head_is_what_the_class_count_sizes_and_every_parameter_has_one_part(name):
    """The head found in a model is exactly the parameters whose shape follows num_classes (two builds, 7
    and 11 classes, on the meta device), auxiliary heads aside; head, aux and body split all parameters."""
    kwargs = {"aux_logits": True, "init_weights": False} if name in ("inception_v3", "googlenet") else {}
    with torch.device("meta"):
        seven = torchvision.models.get_model(name, num_classes=7, **kwargs)
        eleven = torchvision.models.get_model(name, num_classes=11, **kwargs)
    sized = {k for (k, a), (_, b) in zip(seven.named_parameters(), eleven.named_parameters()) if a.shape != b.shape}
    parts = model_parts(seven, 7)
    assert set(parts.head) == {k for k in sized if k.split(".")[0] not in ("AuxLogits", "aux1", "aux2")}
    assert set(parts.head) | set(parts.aux) >= sized
    every = [k for k, _ in seven.named_parameters()]
    assert sorted([*parts.head, *parts.aux, *parts.body]) == sorted(every)
    assert len(parts.layers) >= 7  # enough layers for layer-wise rates to mean something
    assert bool(parts.aux) == (name in ("inception_v3", "googlenet"))


def test_own_models_and_a_binary_head():
    from inceptionlab.models.small import text_classifier

    model = text_classifier(num_classes=2, vocab_size=50)
    parts = model_parts(model, 2)
    assert parts.head == ("fc.weight", "fc.bias") and parts.body == ("embedding.weight",)


# --------------------------------------------------------------------------- rates


def test_layer_decay_and_body_multiplier_and_no_decay_on_norm_and_bias():
    model = torchvision.models.resnet18(num_classes=3)
    parts = model_parts(model, 3)
    optimizer = build_optimizer(model, OptimConfig(lr=0.1, weight_decay=1e-4), parts=parts,
                                finetune=FinetuneConfig(layer_decay=0.5, body_lr_mult=0.1))
    groups = {g["name"]: g for g in optimizer.param_groups}
    depth = len(parts.layers)  # resnet18: conv1, bn1, 8 blocks
    assert depth == 10 and groups["head"]["lr"] == pytest.approx(0.1)
    assert groups["body/layer4.1"]["lr"] == pytest.approx(0.1 * 0.1 * 0.5)  # next to the head: decay^1
    assert groups["body/conv1"]["lr"] == pytest.approx(0.1 * 0.1 * 0.5**10)  # the stem: decay^depth
    named = {id(p): n for n, p in model.named_parameters()}
    undecayed = {named[id(p)] for g in optimizer.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    assert "fc.bias" in undecayed and "layer1.0.bn1.weight" in undecayed and "layer1.0.bn1.bias" in undecayed
    assert "fc.weight" not in undecayed and "layer1.0.conv1.weight" not in undecayed
    everything = build_optimizer(model, OptimConfig(lr=0.1, decay_norm_and_bias=True), parts=parts)
    assert all(g["weight_decay"] == 1e-4 for g in everything.param_groups)


def rates(schedule: ScheduleConfig, epochs: int, steps: int, freeze: int = 0) -> list[dict[str, float]]:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 3))
    parts = model_parts(model, 3)
    optimizer = build_optimizer(model, OptimConfig(name="sgd", lr=1.0, weight_decay=0), parts=parts)
    scheduler = build_scheduler(optimizer, schedule, epochs, steps_per_epoch=steps, freeze_epochs=freeze, lr=1.0)
    seen = []
    for _ in range(epochs * steps):
        seen.append({g["part"]: g["lr"] for g in optimizer.param_groups})
        optimizer.step()
        scheduler.step()
    return seen


def test_warm_up_rises_every_step_and_restarts_at_the_unfreeze():
    schedule = ScheduleConfig(name="constant", warmup_epochs=1, warmup_start_factor=0.2)
    per_step = [r["head"] for r in rates(schedule, 3, 4)]
    assert per_step[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])  # +0.8/4 per step over 4 steps
    per_epoch = [r["head"] for r in rates(ScheduleConfig(name="constant", warmup_epochs=2, warmup_per_step=False,
                                                         warmup_start_factor=0.2), 3, 4)]
    assert per_epoch == pytest.approx([0.2] * 4 + [0.6] * 4 + [1.0] * 4)
    frozen = rates(ScheduleConfig(name="cosine", warmup_epochs=1, warmup_start_factor=0.2), 4, 2, freeze=1)
    assert [r["head"] for r in frozen[:2]] == [1.0, 1.0] and [r["body"] for r in frozen[:2]] == [0.0, 0.0]
    assert [r["body"] for r in frozen[2:4]] == pytest.approx([0.2, 0.6])  # the warm-up starts at the unfreeze
    cosine = [r["body"] for r in frozen[4:]]  # then cosine over the 2 epochs left after the warm-up
    assert cosine == pytest.approx([1.0, 1.0, (1 + math.cos(math.pi / 2)) / 2] * 1 + [0.5])


def test_a_linear_probe_schedules_the_head_over_the_whole_run():
    probe = rates(ScheduleConfig(name="steplr", step_size=1, gamma=0.5), 3, 1, freeze=3)
    assert [r["head"] for r in probe] == [1.0, 0.5, 0.25] and all(r["body"] == 0 for r in probe)


# --------------------------------------------------------------------------- starting weights


def test_continue_from_a_run_directory_with_other_classes(tmp_path):
    """A run on cat/dog/fox, then a run on dog/cat/owl from its directory: the body is the run's model.pt,
    the head's rows of dog and cat are carried over by name, owl's starts new; the report says so."""
    first_data = make_image_folder(tmp_path / "a")
    first = fit(recipe_for(first_data, *SMALL_CNN, "train.epochs=1"), tmp_path / "runs", progress=False)
    second_data = make_image_folder(tmp_path / "b", classes=("cat", "dog", "owl"))
    (second_data / "train" / "cat").rename(second_data / "train" / "zcat")  # folder order: dog, owl, zcat
    (second_data / "val" / "cat").rename(second_data / "val" / "zcat")
    from inceptionlab.engine.session import build_training_session

    recipe = recipe_for(second_data, *SMALL_CNN, f"model.weights={first.run_dir}")
    s = build_training_session(recipe)
    before = state_of(first.run_dir / "model.pt")
    now = s.model.state_dict()
    for key in before:
        if not key.startswith("11."):  # the body: exactly the run's weights
            assert torch.equal(now[key], before[key]), key
    assert torch.equal(now["11.weight"][0], before["11.weight"][1])  # dog: row 1 there, row 0 here
    assert not torch.equal(now["11.weight"][1], before["11.weight"][0])  # owl: new
    line = next(n for n in s.notes if "head" in n and "replaced" in n)
    assert "1 of 3 classes carried over by name" in line and "new: owl, zcat" in line
    assert any("3 of" in n or "tensors loaded" in n for n in s.notes)
    same = build_training_session(recipe_for(first_data, *SMALL_CNN, f"model.weights={first.run_dir}"))
    assert any("kept (the same 3 classes)" in n for n in same.notes)
    assert torch.equal(same.model.state_dict()["11.weight"], before["11.weight"])


def test_a_plain_weights_file_keeps_its_head_for_as_many_classes_and_replaces_it_otherwise(tmp_path):
    from inceptionlab.models.registry import build_model

    torch.manual_seed(0)
    source = torchvision.models.resnet18(num_classes=3)
    torch.save(source.state_dict(), tmp_path / "w.pt")
    kept = build_model("resnet18", 3, str(tmp_path / "w.pt"), class_names=["a", "b", "c"])
    assert torch.equal(kept.model.fc.weight, source.fc.weight)
    assert "head fc kept (3 outputs; the weights do not name their classes)" in kept.report[1]
    fresh = build_model("resnet18", 5, str(tmp_path / "w.pt"))
    assert fresh.model.fc.out_features == 5 and "starts new (3 classes in the weights, 5 here)" in fresh.report[1]
    assert torch.equal(fresh.model.layer4[1].conv2.weight, source.layer4[1].conv2.weight)


def test_weights_of_another_architecture_are_a_clear_error(tmp_path, image_folder):
    run = fit(recipe_for(image_folder, *SMALL_CNN, "train.epochs=1"), tmp_path / "runs", progress=False)
    from inceptionlab.engine.session import build_training_session
    from inceptionlab.errors import UserError

    with pytest.raises(UserError, match="weights of a cifar10_cnn model, not resnet18: set model.name=cifar10_cnn"):
        build_training_session(recipe_for(image_folder, *RESNET, f"model.weights={run.run_dir}"))


# --------------------------------------------------------------------------- frozen body


@pytest.mark.slow  # resnet18, two runs of 2-3 epochs
def test_head_epochs_leave_the_body_and_its_batchnorm_statistics_bit_identical(tmp_path, image_folder):
    """Two head-only epochs through the frozen body (the slow path): every body tensor, BatchNorm's running
    statistics included, is bit-identical to the starting weights; the head moved. Then one whole-model
    epoch moves the body."""
    torch.manual_seed(0)
    start = torchvision.models.resnet18(num_classes=3).state_dict()
    torch.save(start, tmp_path / "start.pt")
    common = [*RESNET, f"model.weights={tmp_path / 'start.pt'}", "finetune.freeze_epochs=2",
              "finetune.feature_cache=false", "optim.lr=0.05"]
    frozen = fit(recipe_for(image_folder, *common, "train.epochs=2"), tmp_path / "a", progress=False)
    after = state_of(frozen.run_dir / "model.pt")
    for key, value in start.items():
        if key.startswith("fc."):
            assert not torch.equal(after[key], value)
        else:
            assert torch.equal(after[key], value), f"{key} changed while frozen"
    # finetune.bn=train (the default): the statistics move once the body trains. At lr 0.05 the whole-model
    # epoch's validation loss explodes (1.9e9) and the run stops as diverged, keeping the head's epoch: 0.005.
    thawed = fit(recipe_for(image_folder, *common, "train.epochs=3", "finetune.bn=train", "optim.lr=0.005"),
                 tmp_path / "b", progress=False)
    assert not torch.equal(state_of(thawed.run_dir / "model.pt")["layer1.0.conv1.weight"], start["layer1.0.conv1.weight"])
    assert not torch.equal(state_of(thawed.run_dir / "model.pt")["bn1.running_mean"], start["bn1.running_mean"])


@pytest.mark.slow  # three 2-epoch runs on 150 images
def test_cached_features_train_the_head_as_the_frozen_body_does(tmp_path, cifar_root):
    """On in-memory data (no augmentation on either path) a linear probe on cached features ends with the
    head a probe through the frozen body gets (up to float rounding: the body ran at other batch sizes);
    a second run reads the features from the cache."""
    weights, _ = start_weights(tmp_path, classes=10)
    sets = [f"model.weights={weights}", "train.epochs=2", "finetune.freeze_epochs=2", "train.batch_size=16",
            "data.num_workers=0", f"data.root={cifar_root}"]
    slow = fit(load_recipe("cifar10/small_cnn", [*sets, "finetune.feature_cache=false"]), tmp_path / "s", progress=False)
    fast = fit(load_recipe("cifar10/small_cnn", [*sets, "finetune.feature_cache=true"]), tmp_path / "f", progress=False)
    a, b = state_of(slow.run_dir / "model.pt"), state_of(fast.run_dir / "model.pt")
    for key in a:
        assert torch.allclose(a[key], b[key], atol=1e-5), key
    rows = [json.loads(line) for line in (fast.run_dir / "metrics.jsonl").read_text().splitlines()]
    slow_rows = [json.loads(line) for line in (slow.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["val_loss"] == pytest.approx(slow_rows[-1]["val_loss"], rel=1e-4)
    again = fit(load_recipe("cifar10/small_cnn", [*sets, "finetune.feature_cache=true"]), tmp_path / "g", progress=False)
    assert torch.equal(state_of(again.run_dir / "model.pt")["11.weight"], b["11.weight"])


def test_a_head_that_does_not_make_the_output_falls_back_to_the_frozen_body(tmp_path, image_folder, capsys):
    """SqueezeNet's output conv feeds a ReLU and pooling: its input is not a feature the head alone maps to the output."""
    weights, _ = start_weights(tmp_path, "squeezenet1_1")
    sets = ["model.name=squeezenet1_1", "data.train_crop_size=64", "data.val_resize_size=64", "data.val_crop_size=64",
            "train.epochs=1", "finetune.freeze_epochs=1", f"model.weights={weights}"]
    outcome = fit(recipe_for(image_folder, *sets), tmp_path / "runs", progress=False)
    assert outcome.status == "completed"
    assert "features: not used (classifier.1 of squeezenet1_1" in capsys.readouterr().out


@pytest.mark.slow  # resnet18, three runs of 3 epochs
def test_resume_across_the_unfreeze_is_bit_exact(tmp_path, image_folder):
    """Head-only epoch 1 on cached features, whole model from epoch 2, EMA and a balanced sampler on: a run
    stopped in epoch 2 and resumed ends with the weights (and average) of a run that never stopped."""
    weights, _ = start_weights(tmp_path, "resnet18")
    sets = [*RESNET, f"model.weights={weights}", "train.epochs=3", "finetune.freeze_epochs=1", "ema.decay=0.8",
            "data.sampler=balanced",
            "schedule.name=cosine", "schedule.warmup_epochs=1", ONE_THREAD]
    straight = fit(recipe_for(image_folder, *sets), tmp_path / "a", progress=False)
    stop, epochs_seen = StopSignal(), []

    def stop_in_epoch_2(step, loss):
        if step == 1:
            epochs_seen.append(1)
        if len(epochs_seen) == 2 and step == 2:
            stop.request()

    stopped = fit(recipe_for(image_folder, *sets), tmp_path / "b", progress=False, stop=stop, on_log=stop_in_epoch_2)
    assert stopped.status == "interrupted"
    resumed = fit(recipe_for(image_folder, *sets), tmp_path / "b", stopped.run_dir, progress=False)
    assert resumed.status == "completed"
    a, b = state_of(straight.run_dir / "checkpoints" / "last.pt"), state_of(resumed.run_dir / "checkpoints" / "last.pt")
    for part in ("model",):
        for key in a[part]:
            assert torch.equal(a[part][key], b[part][key]), f"{part}.{key}"
    for key in a["ema"]["weights"]:
        assert torch.equal(a["ema"]["weights"][key], b["ema"]["weights"][key]), f"ema.{key}"
    assert a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"]


@pytest.mark.parametrize("loader", ["workers", "stream"])
def test_features_of_the_worker_and_stream_paths_score_as_the_saved_model_does(tmp_path, image_folder, loader):
    """A linear probe on cached features (taken through the eval view of each data path): its last validation
    loss equals `evaluate` of the saved model.pt on the same images."""
    from inceptionlab.judge.evaluate import evaluate_run

    weights, _ = start_weights(tmp_path)
    sets = [*SMALL_CNN, f"model.weights={weights}", f"data.loader={loader}", "train.epochs=2",
            "finetune.freeze_epochs=2"]
    outcome = fit(recipe_for(image_folder, *sets), tmp_path / "runs", progress=False)
    rows = [json.loads(line) for line in (outcome.run_dir / "metrics.jsonl").read_text().splitlines()]
    kept = next(row for row in rows if row["epoch"] == outcome.summary["model_epoch"])
    scored = evaluate_run(outcome.run_dir, None, None, device=torch.device("cpu"), batch_size=5, num_workers=0)
    assert scored.result["loss"] == pytest.approx(kept["val_loss"], rel=1e-4, abs=1e-5)
    assert scored.result["top1"] == pytest.approx(kept["val_top1"])


def test_a_balanced_sampler_on_cached_features_skips_what_the_images_skip(tmp_path, image_folder):
    """data.sampler=balanced, head-only epochs on cached features and an unreadable training JPEG: the
    features have one row fewer than the split has files, and the sampler's weights must follow them
    (the image loaders dropped the unreadable file's weight, the feature loader did not: ValueError
    "19 sample weights for 18 samples" once the work of extracting was done)."""
    weights, _ = start_weights(tmp_path)
    add_unreadable_jpegs(image_folder, 1)
    sets = [*SMALL_CNN, f"model.weights={weights}", "data.sampler=balanced", "finetune.freeze_epochs=1",
            "train.epochs=1"]
    outcome = fit(recipe_for(image_folder, *sets), tmp_path / "runs", progress=False)
    assert outcome.status == "completed"
    assert outcome.summary["features"]["train"] == 18 and len(outcome.summary["skipped_files"]) == 1
    rows = [json.loads(line) for line in (outcome.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["samples"] == 16  # 18 draws, 4 full batches of 4


def test_the_schedule_counts_epochs_not_the_steps_of_another_loader(tmp_path, image_folder):
    """Two unreadable JPEGs among 20 training files, the worker path: the image loader has 5 steps per
    epoch (20 // 4: files are skipped inside batches), the head-only epoch on cached features 4 (18 // 4).
    The schedule, counted in the image loader's steps, put the unfreeze a step early: the warm-up after
    it started at the head-only rate with the body still at 0, not at warmup_start_factor x lr for both."""
    weights, _ = start_weights(tmp_path)
    add_unreadable_jpegs(image_folder, 2)
    sets = [*SMALL_CNN, f"model.weights={weights}", "data.loader=workers", "finetune.freeze_epochs=1",
            "train.epochs=2", "schedule.name=constant", "schedule.warmup_epochs=1", "schedule.warmup_start_factor=0.2",
            "optim.lr=0.01"]
    outcome = fit(recipe_for(image_folder, *sets), tmp_path / "runs", progress=False)
    assert outcome.status == "completed" and outcome.summary["features"]["train"] == 18
    rows = [json.loads(line) for line in (outcome.run_dir / "metrics.jsonl").read_text().splitlines()]
    unfrozen = next(row for row in rows if row["epoch"] == 2)
    assert unfrozen["lr"] == pytest.approx(0.2 * 0.01) and unfrozen["lr_body"] == pytest.approx(0.2 * 0.01)


# --------------------------------------------------------------------------- where fine-tuning starts


def test_a_run_from_weights_scores_them_first_and_never_keeps_worse(tmp_path, image_folder, capsys, monkeypatch):
    """A run that learnt the squares (val top-1 1.0), then one epoch of a from-scratch recipe on its weights
    (AdamW 0.2 on every layer from the first step) scores chance: before, that ended "completed" with the
    wrecked weights in model.pt. Now the starting weights are validated as epoch 0 (metrics.jsonl and the
    output), compete for best.pt, and model.pt keeps them since the last epoch scored below them; the run
    warns of the from-scratch recipe, naming the settings, before it starts."""
    sets = [*SMALL_CNN, "optim.name=adamw", "optim.weight_decay=0"]
    first = fit(recipe_for(image_folder, *sets, "train.epochs=4", "optim.lr=0.003"), tmp_path / "a", progress=False)
    assert first.summary["last"]["top1"] == 1.0
    wreck = [*sets, "train.epochs=1", "optim.lr=0.2", f"model.weights={first.run_dir}"]
    # The wreck's validation loss explodes (2e-06 -> 372): by default the run stops there as diverged and
    # model.pt keeps the starting weights (epoch 0, the best).
    stopped = fit(recipe_for(image_folder, *wreck), tmp_path / "c", progress=False)
    assert stopped.status == "diverged" and stopped.summary["model_epoch"] == 0
    assert all(torch.equal(value, state_of(stopped.run_dir / "model.pt")[key])
               for key, value in state_of(first.run_dir / "model.pt").items())
    # The rule set aside, the run completes worse than it began: the path of a model that scores below its
    # start without exploding.
    from inceptionlab.engine import fit as fit_module

    monkeypatch.setattr(fit_module, "EXPLODED", float("inf"))
    capsys.readouterr()
    again = fit(recipe_for(image_folder, *sets, "train.epochs=1", "optim.lr=0.2", f"model.weights={first.run_dir}"),
                tmp_path / "b", progress=False)
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in (again.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [0, 1]
    assert rows[0]["val_top1"] == 1.0 and rows[1]["val_top1"] < 0.5 and "train_loss" not in rows[0]
    assert again.status == "completed" and again.summary["best"]["epoch"] == 0 and again.summary["model_epoch"] == 0
    start, kept = state_of(first.run_dir / "model.pt"), state_of(again.run_dir / "model.pt")
    assert all(torch.equal(start[key], kept[key]) for key in start)
    assert torch.equal(state_of(again.run_dir / "checkpoints" / "best.pt")["model"]["0.weight"], start["0.weight"])
    assert "epoch 0/1 (the starting weights)" in out and "val_top1 1.0000" in out
    assert "model.pt: the weights of epoch 0" in out
    (warning,) = [line for line in out.splitlines() if line.startswith("warning: model.weights=")]
    assert all(key in warning for key in ("optim.lr=0.2", "schedule.warmup_epochs", "finetune.freeze_epochs"))
    check_example("fine-tuning-from-scratch-warning", warning)
    check_example("fine-tuning-model-kept", next(line for line in out.splitlines() if line.startswith("model.pt:")))


def test_a_random_body_is_not_frozen_and_a_linear_probe_on_it_is_refused(tmp_path, image_folder, capsys):
    """model.weights=null (inception_v3/tiny_imagenet_fast's case): head-only epochs on a random body train
    a linear probe on random features (train loss 2.3e21 there, a NaN validation loss, "completed"). They
    are skipped, said so, and the whole model trains from epoch 1; a linear probe of a random body is
    refused before any work."""
    from inceptionlab.engine.session import build_training_session
    from inceptionlab.errors import UserError

    outcome = fit(recipe_for(image_folder, *SMALL_CNN, "finetune.freeze_epochs=1", "train.epochs=2"), tmp_path / "a",
                  progress=False)
    out = capsys.readouterr().out
    assert "finetune.freeze_epochs=1 skipped: the body is random init (model.weights=null)" in out
    rows = [json.loads(line) for line in (outcome.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["lr_body"] > 0 and "features" not in outcome.summary
    with pytest.raises(UserError, match=r"finetune.freeze_epochs=2 .*random body.*set model.weights"):
        build_training_session(recipe_for(image_folder, *SMALL_CNN, "finetune.freeze_epochs=2", "train.epochs=2"))


def test_the_imagefolder_recipe_as_it_ships_is_a_linear_probe_of_trained_weights_and_refuses_a_random_body(
        tmp_path, image_folder):
    """inception_v3/imagefolder with only the data, a small model and its weights given (FAST's sizes, none of
    its training values): the head trains on cached features, every body tensor (BatchNorm's statistics too)
    stays bit-identical, nothing warns about a from-scratch schedule; a random body is refused with the fix.
    Measured on real ImageNet weights, the probe beat every schedule that trained the body with 20 photos a class
    (docs/fine-tuning.md); before, the recipe trained the whole model at the guide's lr 0.1 from step one."""
    from inceptionlab.engine.session import build_training_session
    from inceptionlab.errors import UserError

    sizes = [s for s in FAST if not s.startswith(("finetune.", "train.label_smoothing", "train.epochs", "schedule.",
                                                  "optim.", "model.weights"))]
    torch.manual_seed(0)
    start = torchvision.models.resnet18(num_classes=3).state_dict()
    torch.save(start, tmp_path / "start.pt")
    recipe = load_recipe("inception_v3/imagefolder", [*sizes, *RESNET, f"data.root={image_folder}",
                                                      f"model.weights={tmp_path / 'start.pt'}"])
    session = build_training_session(recipe)
    assert not [note for note in session.notes if note.startswith("warning: model.weights")], session.notes
    outcome = fit(recipe, tmp_path / "runs", progress=False)
    assert "features" in outcome.summary  # the head trained on the body's cached features
    rows = [json.loads(line) for line in (outcome.run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [row for row in rows if row["epoch"] > 0]
    assert len(trained) == 6 and all(row["lr_body"] == 0 for row in trained)  # 6 epochs, the body never stepped
    after = state_of(outcome.run_dir / "model.pt")
    changed = [key for key, value in start.items() if not key.startswith("fc.") and not torch.equal(after[key], value)]
    assert not changed, changed
    with pytest.raises(UserError, match=r"finetune.body_lr_mult=0 .*random body.*set model.weights.*finetune.body_lr_mult=1"):
        build_training_session(load_recipe("inception_v3/imagefolder", [*sizes, *RESNET, f"data.root={image_folder}",
                                                                        "model.weights=null"]))


@pytest.mark.parametrize("augment", [["augment.policy=trivialaugment"], ["augment.mixup_alpha=0.2"]],
                         ids=["policy", "mixup"])
def test_asked_for_augmentation_is_not_dropped_by_the_feature_cache(tmp_path, image_folder, capsys, augment):
    """The probe's cached features are the eval view of each image, and their step does not mix: with
    augment.* set, finetune.feature_cache=auto trains the head through the frozen body instead, and says so;
    =true with augmentation is refused before any work. (Before, the imagefolder recipe's probe with
    training.md's augmentation example silently trained on unaugmented, unmixed features.)"""
    from inceptionlab.engine.session import build_training_session
    from inceptionlab.errors import UserError

    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18(num_classes=3).state_dict(), tmp_path / "start.pt")
    probe = [*RESNET, f"model.weights={tmp_path / 'start.pt'}", "finetune.body_lr_mult=0", *augment]
    outcome = fit(recipe_for(image_folder, *probe), tmp_path / "a", progress=False)
    out = capsys.readouterr().out
    assert "features" not in outcome.summary
    assert f"features: not cached: {augment[0]} changes" in out, out
    with pytest.raises(UserError, match=r"finetune.feature_cache=true.*augment.*finetune.feature_cache=auto"):
        build_training_session(recipe_for(image_folder, *probe, "finetune.feature_cache=true"))


def test_a_linear_probe_with_few_steps_in_all_says_so_with_the_measured_fix(tmp_path, image_folder):
    """With 10 photos a class the probe's head got 24 SGD steps in 6 epochs and scored 0.547 on Fashion-MNIST,
    against 0.727 with lr 0.1 and 10 epochs (40 steps; benchmarks/transfer_real.py): nothing said so. A probe
    under 40 steps in all now says how many it gets and what raised them; whole-model training and a probe
    with enough steps say nothing of it."""
    from inceptionlab.engine.session import build_training_session

    weights, _ = start_weights(tmp_path)
    probe = [*SMALL_CNN, f"model.weights={weights}", "finetune.body_lr_mult=0", "train.batch_size=4"]
    few = build_training_session(recipe_for(image_folder, *probe, "train.epochs=2"))
    per_epoch = few.steps_per_epoch
    line = f"note: the head gets {per_epoch * 2} optimizer steps in all ({per_epoch} an epoch x 2 epochs)"
    assert [n for n in few.notes if n.startswith(line)], few.notes
    assert "train.epochs" in next(n for n in few.notes if n.startswith(line))
    enough = build_training_session(recipe_for(image_folder, *probe, f"train.epochs={-(-40 // per_epoch)}"))
    whole = build_training_session(recipe_for(image_folder, *SMALL_CNN, f"model.weights={weights}", "train.epochs=2",
                                              "schedule.warmup_epochs=1"))
    for session in (enough, whole):
        assert not [n for n in session.notes if "optimizer steps in all" in n], session.notes


def test_a_fine_tuning_recipe_from_weights_is_not_warned_about(tmp_path, image_folder):
    from inceptionlab.engine.session import build_training_session

    weights, _ = start_weights(tmp_path)
    warm = build_training_session(recipe_for(image_folder, *SMALL_CNN, f"model.weights={weights}",
                                             "schedule.warmup_epochs=1"))
    assert not [note for note in warm.notes if note.startswith("warning: model.weights")]


def test_a_non_finite_validation_loss_stops_the_run_as_diverged(tmp_path, image_folder, monkeypatch):
    """The training loss stays finite while the validation loss is NaN (a linear probe on random features
    blew up to 2.3e21 in training, NaN in validation, and the run ended "completed")."""
    from inceptionlab.engine import session as engine_session
    from inceptionlab.errors import UserError

    real_make_task = engine_session.make_task

    def nan_in_validation(*args, **kwargs):
        task = real_make_task(*args, **kwargs)
        real_eval_loss = task.eval_loss
        task.eval_loss = lambda logits, targets: real_eval_loss(logits, targets) * float("nan")
        return task

    monkeypatch.setattr(engine_session, "make_task", nan_in_validation)
    with pytest.raises(UserError) as err:
        fit(recipe_for(image_folder, *SMALL_CNN, "train.epochs=2"), tmp_path / "runs", progress=False)
    assert err.value.exit_code == 3
    assert "validation loss after epoch 1 is nan" in str(err.value) and "lower optim.lr" in str(err.value)
    run = next((tmp_path / "runs").glob("*/*/*"))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "diverged" and not (run / "model.pt").exists()
    assert not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text().strip()


def scale_validation_loss(monkeypatch, factor, from_call):
    """The task's validation loss times `factor` from its `from_call`-th evaluation on (each evaluation of a
    split calls make_task's eval_loss once per batch; the split here is one batch): the training is untouched,
    so only the rule that reads the validation loss can stop the run."""
    from inceptionlab.engine import session as engine_session

    real_make_task, calls = engine_session.make_task, []

    def scaled(*args, **kwargs):
        task = real_make_task(*args, **kwargs)
        real_eval_loss = task.eval_loss

        def eval_loss(logits, targets):
            calls.append(1)
            return real_eval_loss(logits, targets) * (factor if len(calls) >= from_call else 1.0)

        task.eval_loss = eval_loss
        return task

    monkeypatch.setattr(engine_session, "make_task", scaled)


def test_a_validation_loss_that_explodes_stops_the_run_as_diverged_keeping_the_best_weights(
        tmp_path, image_folder, monkeypatch, capsys):
    """Issue 41: runs whose validation loss went from 0.6 to 1e5 and 2.5e16 (finite) at the unfreeze ended
    "completed", model.pt holding the collapsed weights. A validation loss above 10x the lowest so far and
    above a uniform guess's (ln of the class count) stops the run as diverged; model.pt holds the best epoch's
    weights (best.pt's), the exploded epoch is not recorded, and the run says what it kept."""
    weights, _ = start_weights(tmp_path)
    scale_validation_loss(monkeypatch, 1e4, from_call=3)  # epoch 0 (the start), epoch 1, then epoch 2 explodes
    outcome = fit(recipe_for(image_folder, *SMALL_CNN, f"model.weights={weights}", "train.epochs=3",
                             "train.batch_size=32"), tmp_path / "runs", progress=False)
    said = capsys.readouterr().out
    assert outcome.status == "diverged"
    summary = json.loads((outcome.run_dir / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["epochs_done"] == 1
    assert "validation loss after epoch 2" in said and "10x the lowest so far" in said
    rows = [json.loads(line) for line in (outcome.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [0, 1]
    best = state_of(outcome.run_dir / "checkpoints" / "best.pt")["model"]
    kept = state_of(outcome.run_dir / "model.pt")
    assert all(torch.equal(kept[key], value) for key, value in best.items())


def test_a_validation_loss_that_rises_a_few_times_is_not_divergence(tmp_path, image_folder, monkeypatch):
    """Overfitting raises the validation loss by a small factor: the run goes on (3x here)."""
    weights, _ = start_weights(tmp_path)
    scale_validation_loss(monkeypatch, 3.0, from_call=3)
    outcome = fit(recipe_for(image_folder, *SMALL_CNN, f"model.weights={weights}", "train.epochs=2",
                             "train.batch_size=32"), tmp_path / "runs", progress=False)
    assert outcome.status == "completed"


# --------------------------------------------------------------------------- BatchNorm, a policy of the stage


def batchnorm_statistics(state):
    return {key: value for key, value in state.items() if key.endswith(("running_mean", "running_var"))}


def test_a_body_at_rate_zero_is_frozen_batchnorm_statistics_included(tmp_path, image_folder, capsys):
    """finetune.body_lr_mult=0 from the first epoch: the body's weights stayed, but it ran in training mode,
    so its BatchNorm statistics drifted with every batch: a "frozen" body that was not. Now a body at rate 0
    is frozen as in head-only epochs, said so, and every body tensor ends bit-identical to the start."""
    weights, start = start_weights(tmp_path, "resnet18")
    outcome = fit(recipe_for(image_folder, *RESNET, f"model.weights={weights}", "finetune.body_lr_mult=0",
                             "train.epochs=1", "optim.lr=0.05"), tmp_path / "runs", progress=False)
    after = state_of(outcome.run_dir / "checkpoints" / "last.pt")["model"]
    assert batchnorm_statistics(start) and all(torch.equal(after[key], value) for key, value in start.items()
                                               if not key.startswith("fc."))
    assert not torch.equal(after["fc.weight"], start["fc.weight"])
    assert "finetune.body_lr_mult=0" in capsys.readouterr().out


def test_batchnorm_policy_frozen_keeps_the_statistics_while_the_body_trains(tmp_path, image_folder, capsys):
    """finetune.bn=frozen (detection models' FrozenBatchNorm2d, for small batches): the body trains, its
    BatchNorm layers use and keep their running statistics; the policy is said and recorded in the run."""
    weights, start = start_weights(tmp_path, "resnet18")
    outcome = fit(recipe_for(image_folder, *RESNET, f"model.weights={weights}", "finetune.bn=frozen",
                             "train.epochs=1", "optim.lr=0.05"), tmp_path / "runs", progress=False)
    assert "finetune.bn=frozen" in capsys.readouterr().out
    after = state_of(outcome.run_dir / "checkpoints" / "last.pt")["model"]
    assert all(torch.equal(after[key], value) for key, value in batchnorm_statistics(start).items())
    assert not torch.equal(after["layer1.0.conv1.weight"], start["layer1.0.conv1.weight"])
    assert not torch.equal(after["bn1.weight"], start["bn1.weight"])  # its scale still trains
    assert "bn: frozen" in (outcome.run_dir / "recipe.resolved.yaml").read_text()


def test_the_feature_cache_says_what_it_saves_once_and_only_when_it_saves(tmp_path, image_folder, capsys):
    """One head-only epoch on cached features saves no pass of the body (the extraction is the one pass the
    epoch would make): "about 0 s of forward passes saved" said nothing; for eight, the total read as per
    epoch ("against images through the body every epoch"). Now: the passes saved, in all, or nothing."""
    def features_line(*sets):
        capsys.readouterr()
        fit(recipe_for(image_folder, *SMALL_CNN, "finetune.freeze_epochs=3", *sets), tmp_path / "runs", progress=False)
        (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("features:")]
        assert "every epoch" not in line
        return line

    (tmp_path / "other").mkdir()
    weights, other = start_weights(tmp_path)[0], start_weights(tmp_path / "other", seed=1)[0]
    one = features_line(f"model.weights={weights}", "train.epochs=1")
    assert "27 images through the frozen body once" in one and "save" not in one
    three = features_line(f"model.weights={other}", "train.epochs=3")
    assert "27 images through the frozen body once" in three
    assert "saves 2 passes of the frozen body over both splits (about " in three and " s in all" in three
    again = features_line(f"model.weights={other}", "train.epochs=3")
    assert "read from" in again and "saves 3 passes of the frozen body over both splits" in again


def head_inputs(model, head_name, images):
    """What the head receives for `images` in the model's current mode (a forward hook on the head)."""
    seen = []
    handle = model.get_submodule(head_name).register_forward_hook(lambda module, args, out: seen.append(args[0]))
    with torch.no_grad():
        model(images)
    handle.remove()
    return seen[0]


def test_the_head_meets_at_the_unfreeze_the_features_it_was_trained_on(tmp_path, image_folder):
    """Issue 41: head-first-then-whole runs from real Inception weights collapsed at the unfreeze (val 0.82 ->
    chance, val loss 2.5e16). The head trained on cached features of the body in eval mode (running
    statistics); at the unfreeze the default BatchNorm policy switched to batch statistics, and at batch 4 the
    pooled features it met had cosine 0.455 to those it was trained on. With finetune.bn=auto, a body from
    weights whose running statistics differ from its batch statistics (a fresh resnet18's are 0 and 1) hands the
    head the same features after the unfreeze, in training mode, as the cached ones."""
    from inceptionlab.engine.finetune import Stages
    from inceptionlab.engine.session import build_training_session

    weights, _ = start_weights(tmp_path, "resnet18")
    s = build_training_session(recipe_for(image_folder, *RESNET, f"model.weights={weights}", "finetune.bn=auto",
                                          "finetune.freeze_epochs=1", "train.epochs=2", "train.batch_size=4"))
    torch.manual_seed(0)
    images = torch.randn(4, 3, 32, 32)
    s.model.eval()
    cached = head_inputs(s.model, "fc", images)
    stages = Stages(s, s.wrap, lambda line: None)
    whole = stages.for_epoch(1)
    assert whole.name == "all"
    whole.train_mode(whole.runner)
    met = head_inputs(s.model, "fc", images)
    cosine = torch.nn.functional.cosine_similarity(met, cached).min().item()
    assert cosine > 0.999, f"the head meets other features at the unfreeze: cosine {cosine:.3f} to its training's"
    assert torch.allclose(met, cached, atol=1e-5)
