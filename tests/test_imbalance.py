"""Class imbalance: class weights (auto: inverse frequency to a power, mean 1) and the balanced sampler."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from inceptionlab.data.loading.sampler import EpochSampler, balanced_sample_weights, class_counts, inverse_frequency
from inceptionlab.engine.task import make_task

# 4 classes with 80, 40, 10 and 2 samples (a long tail)
TARGETS = torch.tensor([0] * 80 + [1] * 40 + [2] * 10 + [3] * 2)


def test_auto_class_weights_are_inverse_frequency_to_a_power_with_mean_1():
    counts = class_counts(TARGETS, 5)  # class 4 has no sample
    assert counts.tolist() == [80, 40, 10, 2, 0]
    full = inverse_frequency(counts, 1.0)
    raw = torch.tensor([1 / 80, 1 / 40, 1 / 10, 1 / 2], dtype=torch.float64)
    assert torch.allclose(full[:4], raw / raw.mean())
    assert float(full[:4].mean()) == pytest.approx(1.0) and float(full[4]) == 1.0
    root = inverse_frequency(counts, 0.5)
    assert torch.allclose(root[:4], raw.sqrt() / raw.sqrt().mean())
    assert float(root[3] / root[0]) == pytest.approx(40 ** 0.5)  # milder than power 1's 40


def test_weighted_loss_is_cross_entropys_weighted_mean():
    weights = torch.tensor([0.5, 1.0, 2.5])
    task = make_task("multiclass", 3, class_weights=weights)
    logits, targets = torch.randn(6, 3, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 2, 2, 1, 0])
    per_sample = F.cross_entropy(logits, targets, reduction="none")
    expected = (per_sample * weights[targets]).sum() / weights[targets].sum()
    assert float(task.loss(logits, targets)) == pytest.approx(float(expected), rel=1e-6)
    binary = make_task("binary", 2, class_weights=torch.tensor([1.0, 3.0]))
    z, y = torch.tensor([0.3, -1.0, 2.0]), torch.tensor([1, 0, 1])
    bce = F.binary_cross_entropy_with_logits(z, y.float(), reduction="none")
    w = torch.tensor([3.0, 1.0, 3.0])
    assert float(binary.loss(z, y)) == pytest.approx(float((bce * w).sum() / w.sum()), rel=1e-6)


def drawn_classes(sampler: EpochSampler, epochs: range) -> torch.Tensor:
    counts = torch.zeros(4)
    for epoch in epochs:
        sampler.set_epoch(epoch)
        counts += torch.bincount(TARGETS[list(sampler)], minlength=4)
    return counts


def test_balanced_sampler_draws_every_class_about_equally_often():
    """132 draws per epoch over 50 epochs (6,600 draws): each class's share is 1/4 within 3 standard
    deviations of a binomial (sd = sqrt(6600 x 1/4 x 3/4) = 35 draws); the plain shuffle gives 80/132."""
    weights = balanced_sample_weights(TARGETS, 4, 1.0)
    sampler = EpochSampler(len(TARGETS), shuffle=True, seed=3, weights=weights)
    counts = drawn_classes(sampler, range(50))
    assert counts.sum() == 50 * 132
    assert ((counts - 6600 / 4).abs() < 3 * 35.2).all(), counts
    plain = drawn_classes(EpochSampler(len(TARGETS), shuffle=True, seed=3), range(50))
    assert plain.tolist() == [4000, 2000, 500, 100]
    # power 0.5: class c drawn in proportion to n_c x n_c^-0.5 = sqrt(n_c)
    half = drawn_classes(EpochSampler(len(TARGETS), shuffle=True, seed=3,
                                      weights=balanced_sample_weights(TARGETS, 4, 0.5)), range(50))
    share = torch.tensor([80, 40, 10, 2], dtype=torch.float64).sqrt()
    expected = 6600 * share / share.sum()
    assert ((half - expected).abs() < 3 * (expected * (1 - expected / 6600)).sqrt() + 1).all(), (half, expected)


def test_balanced_sampler_is_a_function_of_seed_epoch_and_rank():
    weights = balanced_sample_weights(TARGETS, 4, 1.0)

    def order(seed, epoch, rank, start=0):
        sampler = EpochSampler(len(TARGETS), shuffle=True, seed=seed, rank=rank, world_size=2, weights=weights)
        sampler.set_epoch(epoch, start)
        return list(sampler)

    assert order(0, 1, 0) == order(0, 1, 0)
    assert order(0, 1, 0) != order(0, 2, 0) and order(0, 1, 0) != order(1, 1, 0)
    assert order(0, 1, 0) != order(0, 1, 1) and len(order(0, 1, 0)) == len(order(0, 1, 1)) == 66
    assert order(0, 1, 1, start=10) == order(0, 1, 1)[10:]  # a resumed epoch skips what was consumed
