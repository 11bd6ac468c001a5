"""Gradient accumulation: k micro-batches make the same step as the whole batch (a model without BatchNorm),
with class weights, on skewed batches, with index, one-hot and mixed targets, for both tasks."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from inceptionlab.config import OptimConfig, load_recipe
from inceptionlab.data.transforms.mixing import BatchMix
from inceptionlab.engine.loop import StepSettings, train_step
from inceptionlab.engine.optim import build_optimizer
from inceptionlab.engine.task import make_task
from inceptionlab.models.small import cifar10_cnn

# 12 samples, class 1 (weight 10) filling the first half: a part of 6, 3 or 1 samples has a sum of class
# weights of its own, unlike the whole batch's.
SKEWED = torch.tensor([1, 1, 1, 1, 1, 1, 1, 1, 0, 2, 3, 4])
WEIGHTS = torch.tensor([1.0, 10.0, 1.0, 1.0, 1.0])


def a_batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(12, 3, 32, 32, generator=generator), torch.randint(0, 5, (12,), generator=generator)


def one_step(micro_batch: int | None, inputs: torch.Tensor | None = None, targets: torch.Tensor | None = None,
             class_weights: torch.Tensor | None = None, smoothing: float = 0.1) -> dict[str, torch.Tensor]:
    """The weights after one plain SGD step (its update is the gradient, scaled) on `cifar10_cnn`."""
    torch.manual_seed(0)
    model = cifar10_cnn(num_classes=5)
    if inputs is None:
        inputs, targets = a_batch()
    optimizer = build_optimizer(model.parameters(), OptimConfig(name="sgd", lr=0.1, momentum=0.0, weight_decay=0.0))
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    settings = StepSettings(torch.device("cpu"), micro_batch=micro_batch)
    task = make_task("multiclass", 5, label_smoothing=smoothing, class_weights=class_weights)
    loss, logits = train_step(model, task, optimizer, scaler, settings, inputs, targets)
    return {"loss": loss, "logits": logits, **{k: v.detach().clone() for k, v in model.state_dict().items()}}


def assert_same_step(whole: dict[str, torch.Tensor], parts: dict[str, torch.Tensor]) -> None:
    """The same weights (to float reordering), then the same reported loss and logits."""
    for key in sorted(whole, key=lambda k: k in ("loss", "logits")):
        torch.testing.assert_close(parts[key], whole[key], rtol=1e-5, atol=1e-6, msg=lambda m, k=key: f"{k}: {m}")


@pytest.mark.parametrize("micro", [6, 4, 3, 5])  # 2, 3 and 4 equal parts; 5: parts of 5, 5 and 2
def test_micro_batches_equal_one_batch(micro):
    assert_same_step(one_step(None), one_step(micro))


@pytest.mark.parametrize("micro", [1, 3, 6])
def test_micro_batches_equal_one_batch_with_class_weights_on_a_skewed_batch(micro):
    """The step divides the parts' summed losses once, by the whole batch's sum of class weights: each
    part divided by its own sum and weighted by its share moved the weights by up to 4e-2 off the batch's."""
    inputs = a_batch()[0]
    assert_same_step(one_step(None, inputs, SKEWED, WEIGHTS), one_step(micro, inputs, SKEWED, WEIGHTS))


def test_class_weights_act_at_one_sample_per_micro_batch():
    """A part of one sample divided by its own weight cancelled the weight: without label smoothing the
    weighted step was exactly the plain one."""
    inputs = a_batch()[0]
    weighted = one_step(1, inputs, SKEWED, WEIGHTS, smoothing=0.0)
    plain = one_step(1, inputs, SKEWED, None, smoothing=0.0)
    assert not torch.allclose(weighted["11.weight"], plain["11.weight"], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("micro", [None, 1, 3, 6])
def test_one_hot_and_mixed_targets_step_as_index_targets_do_with_class_weights(micro):
    """One-hot targets make the index targets' step, accumulated or not; a MixUp/CutMix batch (each image
    paired with the one before) accumulates to its whole batch's step and keeps the index targets' scale."""
    inputs = a_batch()[0]
    assert_same_step(one_step(None, inputs, SKEWED, WEIGHTS),
                     one_step(micro, inputs, F.one_hot(SKEWED, 5).float(), WEIGHTS))
    for step in (2, 4):  # seed 0 draws CutMix at step 2, MixUp at step 4 (RandomChoice, 50:50)
        mixed, soft = BatchMix(5, mixup_alpha=1.0, cutmix_alpha=1.0, seed=0)(inputs, SKEWED, 0, step)
        assert 0 < float(soft.max(dim=1).values.min()) < 1  # mixed
        assert_same_step(one_step(None, mixed, soft, WEIGHTS), one_step(micro, mixed, soft, WEIGHTS))


def binary_step(micro_batch: int | None, class_weights: torch.Tensor | None) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    inputs = torch.randn(12, 6, generator=torch.Generator().manual_seed(2))
    targets = torch.tensor([1] * 9 + [0] * 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    task = make_task("binary", 2, label_smoothing=0.1, class_weights=class_weights)
    train_step(model, task, optimizer, torch.amp.GradScaler("cpu", enabled=False),
               StepSettings(torch.device("cpu"), micro_batch=micro_batch), inputs, targets)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("micro", [1, 3, 6])
def test_binary_micro_batches_equal_one_batch_with_class_weights(micro):
    weights = torch.tensor([4.0, 1.0])
    assert_same_step(binary_step(None, weights), binary_step(micro, weights))
    assert not torch.allclose(binary_step(1, weights)["2.weight"], binary_step(1, None)["2.weight"], rtol=1e-3)


def test_recipe_micro_batch_must_divide_the_batch():
    with pytest.raises(Exception, match="must divide"):
        load_recipe("demo/digits", ["train.batch_size=32", "train.micro_batch_size=12"])
    recipe = load_recipe("demo/digits", ["train.batch_size=32", "train.micro_batch_size=8"])
    assert recipe.train.micro_batch_size == 8
