"""The weights' average (engine/ema.py): against a hand-computed average, timm's decay, buffers, the run's files."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FAST
from torch import nn

from inceptionlab.config import EmaConfig, load_recipe
from inceptionlab.engine.ema import ModelEma, ema_decay


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def set_all(model: nn.Module, value: float) -> None:
    with torch.no_grad():
        for tensor in [*model.parameters(), model[1].running_mean, model[1].running_var]:
            tensor.fill_(value)
        model[1].num_batches_tracked.fill_(int(value * 10))


def test_three_updates_equal_the_hand_computed_average():
    """Weights 1, 2, 4 after steps 1-3, decay 0.5 without warm-up: the average starts as a copy (1), then
    0.5 x 1 + 0.5 x 2 = 1.5, then 0.5 x 1.5 + 0.5 x 4 = 2.75. BatchNorm's float buffers average the same
    way; its integer step count is copied (timm)."""
    model = tiny_model()
    ema = ModelEma(model, EmaConfig(decay=0.5, warmup=False))
    for value in (1.0, 2.0, 4.0):
        set_all(model, value)
        ema.update(model)
    averaged = ema.module
    for tensor in [*averaged.parameters(), averaged[1].running_mean, averaged[1].running_var]:
        assert torch.allclose(tensor, torch.full_like(tensor, 2.75))
    assert int(averaged[1].num_batches_tracked) == 40  # the last step's, copied
    assert ema.updates == 3


def test_copied_buffers_follow_the_model():
    model = tiny_model()
    ema = ModelEma(model, EmaConfig(decay=0.5, warmup=False, buffers="copy"))
    for value in (1.0, 2.0, 4.0):
        set_all(model, value)
        ema.update(model)
    assert torch.allclose(ema.module[0].weight, torch.full((4, 3), 2.75))
    assert torch.equal(ema.module[1].running_mean, torch.full((4,), 4.0))


@pytest.mark.parametrize("updates_done,expected", [(0, 0.0), (1, 1 - 2 ** -0.75), (9, 1 - 10 ** -0.75),
                                                   (10_000_000, 0.9998)])
def test_decay_warm_up_is_timms(updates_done, expected):
    """timm ModelEmaV3.get_decay(step=k): 0 for k=1, then min(decay, 1 - (1 + (k-1)/gamma)^-power)."""
    assert ema_decay(EmaConfig(decay=0.9998, warmup_power=0.75), updates_done) == pytest.approx(expected)
    assert ema_decay(EmaConfig(decay=0.9998, warmup=False), max(1, updates_done)) == 0.9998


def test_warm_up_average_by_hand():
    """Decay 0.9 capped, warm-up gamma 1 power 1: update 2 uses 1 - 1/2 = 0.5, update 3 1 - 1/3."""
    model = tiny_model()
    ema = ModelEma(model, EmaConfig(decay=0.9, warmup=True, warmup_gamma=1.0, warmup_power=1.0))
    values = (3.0, 6.0, 9.0)
    expected = values[0]
    for k, value in enumerate(values):
        set_all(model, value)
        ema.update(model)
        if k:
            decay = 1 - 1 / (k + 1)
            expected = decay * expected + (1 - decay) * value
    assert torch.allclose(ema.module[2].bias, torch.full((2,), expected))  # 3 -> 4.5 -> 6


def test_state_dict_round_trip_continues_the_same_average():
    model = tiny_model()
    ema = ModelEma(model, EmaConfig(decay=0.8))
    for value in (1.0, 2.0):
        set_all(model, value)
        ema.update(model)
    again = ModelEma(tiny_model(), EmaConfig(decay=0.8))
    again.load_state_dict(ema.state_dict())
    set_all(model, 5.0)
    ema.update(model)
    again.update(model)
    assert ema.updates == again.updates == 3
    for a, b in zip(ema.module.state_dict().values(), again.module.state_dict().values()):
        assert torch.equal(a, b)


def test_a_run_with_ema_keeps_the_average_and_says_so(image_folder, tmp_path):
    """model.pt holds the average (spec.json says "ema"); a checkpoint holds both, and loading it for
    inference gives the average; val_* score the average, val_raw_* the trained weights."""
    from inceptionlab.engine.fit import fit
    from inceptionlab.models.registry import load_state_dict

    recipe = load_recipe("inception_v3/imagefolder", [*FAST, f"data.root={image_folder}", "model.name=cifar10_cnn",
                         "data.train_crop_size=32", "data.val_resize_size=32", "data.val_crop_size=32",
                         "ema.decay=0.5"])
    outcome = fit(recipe, tmp_path / "runs", progress=False)
    run = outcome.run_dir
    assert json.loads((run / "spec.json").read_text())["weights"] == "ema"
    checkpoint = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    model_pt = torch.load(run / "model.pt", weights_only=True)
    for key, value in model_pt.items():
        assert torch.equal(value, checkpoint["ema"]["weights"][key])
    assert any(not torch.equal(checkpoint["model"][k], model_pt[k]) for k in model_pt), "the average is not the model"
    assert all(torch.equal(load_state_dict(run / "checkpoints" / "last.pt")[k], v) for k, v in model_pt.items())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all({"val_top1", "val_raw_top1", "val_raw_loss"} <= set(row) for row in rows)
    assert rows[-1]["val_loss"] != rows[-1]["val_raw_loss"]
