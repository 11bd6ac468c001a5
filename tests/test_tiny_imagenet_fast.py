"""`inception_v3/tiny_imagenet_fast`: fine-tuning settings beside the guide's recipe, and it runs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from inceptionlab.config import load_recipe, recipe_to_dict
from inceptionlab.engine.optim import build_optimizer, build_scheduler
from inceptionlab.engine.fit import fit

FAST_RECIPE = "inception_v3/tiny_imagenet_fast"
# Every key whose value differs from the guide's recipe; each has a comment with its reason in the
# YAML and a row in the table of docs/recipes.md. A new difference must be added here, there and there.
DOCUMENTED_DIFFERENCES = {
    "name", "description",
    "model.aux_loss_weight",
    "data.loader", "data.hflip", "data.train_crop_scale",
    "train.epochs", "train.batch_size", "train.precision", "train.channels_last", "train.compile",
    "train.label_smoothing",
    "optim.lr", "optim.decay_norm_and_bias",
    "schedule.name", "schedule.warmup_epochs",
    "finetune.freeze_epochs", "finetune.layer_decay",
}


def flatten(tree, prefix=""):
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_differs_from_the_guide_only_where_documented():
    guide = flatten(recipe_to_dict(load_recipe("inception_v3/tiny_imagenet")))
    fast = flatten(recipe_to_dict(load_recipe(FAST_RECIPE)))

    assert {key for key in guide if guide[key] != fast[key]} == DOCUMENTED_DIFFERENCES


def test_fine_tuning_values():
    r = load_recipe(FAST_RECIPE)

    assert r.optim.lr == pytest.approx(0.01 * r.train.batch_size / 256)  # linear scaling, fine-tuning base
    assert r.train.batch_size >= 128 and 15 <= r.train.epochs <= 30
    assert (r.model.weights, r.model.aux_loss_weight, r.train.label_smoothing) == ("imagenet", 0.4, 0.1)
    # Speed settings are decided on the machine that trains (inceptionlab.hardware), never pinned from another one.
    assert (r.train.precision, r.train.channels_last, r.train.compile) == ("auto", "auto", "auto")
    assert (r.schedule.name, r.schedule.warmup_epochs, r.schedule.warmup_start_factor) == ("cosine", 2, 0.1)
    assert r.data.loader == "resident"
    assert (r.data.train_crop_size, r.data.val_resize_size, r.data.val_crop_size) == (299, 342, 299)


def test_learning_rate_warms_up_then_follows_a_cosine_to_near_zero():
    r = load_recipe(FAST_RECIPE)
    optimizer = build_optimizer([torch.nn.Parameter(torch.zeros(1))], r.optim)
    scheduler = build_scheduler(optimizer, r.schedule, r.train.epochs)

    lrs = []
    for _ in range(r.train.epochs):  # the lr each epoch trains with, as fit() reads it
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()

    base = r.optim.lr
    assert lrs[0] == pytest.approx(0.1 * base) and lrs[1] == pytest.approx(0.55 * base)
    assert lrs[2] == pytest.approx(base)
    cosine = [base * (1 + math.cos(math.pi * k / 18)) / 2 for k in range(18)]  # 18 epochs after warm-up
    assert lrs[2:] == pytest.approx(cosine)
    assert lrs[-1] < 0.01 * base


@pytest.mark.slow  # 28 s at load 13 on the shared 2 cores, most of it building the run before step 1
def test_two_steps_with_the_aux_head_at_299_px(image_folder, tmp_path, inception_hub, one_cpu_thread):
    # The recipe as shipped (ImageNet weights from the hub cache, aux head at 299 px, bf16,
    # channels_last, label smoothing) on 4 training images in 2 steps; validation at 75 px.
    recipe = load_recipe(FAST_RECIPE, [
        "data.reader=imagefolder", f"data.root={image_folder}", "data.num_workers=0",
        "data.max_train_samples=4", "data.max_val_samples=3", "data.val_resize_size=75", "data.val_crop_size=75",
        "train.batch_size=2", "train.epochs=1", "train.log_every=1",
    ])

    outcome = fit(recipe, tmp_path / "runs", progress=False)

    assert outcome.status == "completed"
    start, row = [json.loads(line) for line in (outcome.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert start["epoch"] == 0 and math.isfinite(start["val_loss"])  # the ImageNet weights, scored before step 1
    assert row["samples"] == 4
    assert math.isfinite(row["train_loss"]) and math.isfinite(row["val_loss"])
    assert row["lr"] == pytest.approx(0.1 * recipe.optim.lr)  # first warm-up epoch
    state = torch.load(outcome.run_dir / "model.pt", map_location="cpu", weights_only=True)
    assert state["AuxLogits.fc.weight"].shape == (3, 768)  # kept and re-headed for the 3 classes
    assert state["fc.weight"].shape == (3, 2048)
