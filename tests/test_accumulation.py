"""Gradient accumulation: k micro-batches make the same step as the whole batch (a model without BatchNorm)."""

from __future__ import annotations

import pytest
import torch

from inceptionlab.config import OptimConfig, load_recipe
from inceptionlab.engine.loop import StepSettings, train_step
from inceptionlab.engine.optim import build_optimizer
from inceptionlab.engine.task import make_task
from inceptionlab.models.small import cifar10_cnn


def one_step(micro_batch: int | None, aux: bool = False) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = cifar10_cnn(num_classes=5)
    generator = torch.Generator().manual_seed(1)
    inputs, targets = torch.randn(12, 3, 32, 32, generator=generator), torch.randint(0, 5, (12,), generator=generator)
    optimizer = build_optimizer(model.parameters(), OptimConfig(name="sgd", lr=0.1, momentum=0.0, weight_decay=0.0))
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    settings = StepSettings(torch.device("cpu"), micro_batch=micro_batch)
    loss, logits = train_step(model, make_task("multiclass", 5, label_smoothing=0.1), optimizer, scaler, settings,
                              inputs, targets)
    return {"loss": loss, "logits": logits, **{k: v.detach().clone() for k, v in model.state_dict().items()}}


@pytest.mark.parametrize("micro", [6, 4, 3, 5])  # 2, 3 and 4 equal parts; 5: parts of 5, 5 and 2
def test_micro_batches_equal_one_batch(micro):
    whole, parts = one_step(None), one_step(micro)
    for key in whole:
        assert torch.allclose(whole[key], parts[key], rtol=1e-5, atol=1e-6), key


def test_recipe_micro_batch_must_divide_the_batch():
    with pytest.raises(Exception, match="must divide"):
        load_recipe("demo/digits", ["train.batch_size=32", "train.micro_batch_size=12"])
    recipe = load_recipe("demo/digits", ["train.batch_size=32", "train.micro_batch_size=8"])
    assert recipe.train.micro_batch_size == 8
