"""MixUp/CutMix on device batches (torchvision's semantics, replayable draws), the soft-target loss with
label smoothing, top-1 against the batch's own labels, the switch-off epoch, the recipe's options, and
bit-exact resume with augmentation on."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ONE_THREAD, make_image_folder
from scipy import stats
from torch import nn
from torch.nn import functional as F

from inceptionlab.config import load_recipe
from inceptionlab.data.transforms.mixing import BatchMix, batch_mix
from inceptionlab.engine.loop import StepSettings, train_one_epoch
from inceptionlab.engine.task import MulticlassTask
from inceptionlab.errors import UserError

ALPHA = 0.001
C = 10


def constant_batch(n: int = 8, size: int = 16) -> torch.Tensor:
    """Image k is the constant k + 1: which source every output pixel came from can be read off."""
    return (torch.arange(n, dtype=torch.float32) + 1).view(n, 1, 1, 1).expand(n, 3, size, size).contiguous()


def test_mixup_pairs_each_image_with_the_one_before_and_weights_targets_alike():
    mix = BatchMix(C, mixup_alpha=0.4, seed=1)
    images, labels = constant_batch(), torch.arange(8)
    out, soft = mix(images, labels, epoch=0, step=3)
    lam = float(soft[1, 1])  # image 1's own label weight
    assert 0 < lam < 1 and soft.shape == (8, C) and soft.dtype == torch.float32
    expected = images * lam + images.roll(1, 0) * (1 - lam)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(soft, F.one_hot(labels, C) * lam + F.one_hot(labels.roll(1), C) * (1 - lam))
    torch.testing.assert_close(soft.sum(dim=1), torch.ones(8))


def test_draws_are_a_function_of_seed_epoch_rank_step_and_leave_the_global_rng_alone():
    images, labels = constant_batch(), torch.arange(8)
    mix = BatchMix(C, mixup_alpha=0.4, cutmix_alpha=1.0, seed=3, rank=0)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = mix(images, labels, epoch=2, step=5)
    assert torch.equal(torch.get_rng_state(), before)
    again = mix(images, labels, epoch=2, step=5)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    others = [mix(images, labels, epoch=e, step=s)[1] for e, s in ((2, 6), (3, 5))]
    others.append(BatchMix(C, mixup_alpha=0.4, cutmix_alpha=1.0, seed=3, rank=1)(images, labels, 2, 5)[1])
    assert all(not torch.equal(first[1], other) for other in others)


def mixup_lambdas(alpha: float, draws: int) -> np.ndarray:
    mix = BatchMix(C, mixup_alpha=alpha, seed=0)
    images, labels = constant_batch(2, 2), torch.tensor([0, 1])
    return np.array([float(mix(images, labels, 0, step)[1][0, 0]) for step in range(draws)])


def test_mixup_lambda_is_beta_alpha_alpha_and_the_test_has_power():
    lambdas = mixup_lambdas(0.2, 1500)
    assert stats.kstest(lambdas, stats.beta(0.2, 0.2).cdf).pvalue > ALPHA
    assert stats.kstest(lambdas, stats.beta(0.4, 0.4).cdf).pvalue < ALPHA  # a wrong alpha is seen


def paper_cutmix_shares(alpha: float, size: int, draws: int, seed: int = 0) -> np.ndarray:
    """The CutMix paper's box, written out independently: lam ~ Beta, centre uniform over pixels, box
    sides size * sqrt(1 - lam) (half-sides truncated), clipped at the border; the replaced area share."""
    rng = np.random.default_rng(seed)
    lam = rng.beta(alpha, alpha, draws)
    cx, cy = rng.integers(0, size, draws), rng.integers(0, size, draws)
    half = (0.5 * np.sqrt(1 - lam) * size).astype(int)
    x1, x2 = np.clip(cx - half, 0, size), np.clip(cx + half, 0, size)
    y1, y2 = np.clip(cy - half, 0, size), np.clip(cy + half, 0, size)
    return (x2 - x1) * (y2 - y1) / size**2


def cutmix_draws(alpha: float, size: int, draws: int) -> tuple[np.ndarray, np.ndarray]:
    """(share of pixels taken from the partner, the partner's label weight) per batch."""
    mix = BatchMix(C, cutmix_alpha=alpha, seed=2)
    images, labels = constant_batch(2, size), torch.tensor([0, 1])
    shares, weights = [], []
    for step in range(draws):
        out, soft = mix(images, labels, 0, step)
        shares.append(float((out[0] != images[0]).float().mean()))
        weights.append(float(soft[0, 1]))
    return np.array(shares), np.array(weights)


def test_cutmix_label_weight_is_the_clipped_box_share():
    """The lambda correction: the partner's weight is the share of pixels actually pasted, clipping included."""
    shares, weights = cutmix_draws(1.0, 24, 300)
    np.testing.assert_allclose(weights, shares, atol=1e-6)
    assert (shares == 0).any() or (shares > 0).all()
    assert 0.05 < shares.mean() < 0.5  # boxes are clipped often: below the unclipped mean share of 0.5


def test_cutmix_box_shares_follow_the_paper_and_the_test_has_power():
    shares, _ = cutmix_draws(1.0, 24, 1500)
    assert stats.ks_2samp(shares, paper_cutmix_shares(1.0, 24, 20_000)).pvalue > ALPHA
    assert stats.ks_2samp(shares, paper_cutmix_shares(3.0, 24, 20_000)).pvalue < ALPHA


def test_with_both_on_each_batch_takes_one_of_them_half_the_time():
    mix = BatchMix(C, mixup_alpha=0.2, cutmix_alpha=1.0, seed=4)
    images, labels = constant_batch(2, 8), torch.tensor([0, 1])
    mixup = 0
    for step in range(400):
        out, soft = mix(images, labels, 0, step)
        values = out[0].unique()
        # MixUp: every pixel the same blend; CutMix: original and pasted values only.
        is_cutmix = bool(((values == 1) | (values == 2)).all())
        mixup += not is_cutmix
    assert stats.binomtest(mixup, 400, 0.5).pvalue > ALPHA


def test_mixing_stops_at_the_off_epoch():
    mix = BatchMix(C, mixup_alpha=1.0, off_epoch=2)
    images, labels = constant_batch(), torch.arange(8)
    assert mix(images, labels, 1, 0)[1].shape == (8, C)
    out, targets = mix(images, labels, 2, 0)
    assert out is images and targets is labels
    assert batch_mix(load_recipe("inception_v3/imagefolder").augment, C, 0, 0) is None  # off by default


def test_channels_last_bf16_batches_keep_their_format():
    images = torch.randn(4, 3, 8, 8).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    for mix in (BatchMix(C, mixup_alpha=0.2), BatchMix(C, cutmix_alpha=1.0)):
        out, _ = mix(images, torch.arange(4), 0, 0)
        assert out.dtype == torch.bfloat16 and out.is_contiguous(memory_format=torch.channels_last)


# --- the loss and the loop ------------------------------------------------------------------------------


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_soft_target_loss_is_smoothed_cross_entropy_in_either_order(smoothing):
    """(1 - e) * q + e / C against the log-probabilities, for a mixed q: the same as mixing smoothed
    one-hot targets (timm's order), and the same formula the hard targets get."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, C, generator=generator)
    y, y_partner, lam = torch.randint(C, (6,), generator=generator), torch.randint(C, (6,), generator=generator), 0.3
    mixed = lam * F.one_hot(y, C) + (1 - lam) * F.one_hot(y_partner, C)
    task = MulticlassTask(C, label_smoothing=smoothing)
    by_hand = -(((1 - smoothing) * mixed + smoothing / C) * logits.log_softmax(dim=1)).sum(dim=1).mean()
    smooth = lambda t: F.one_hot(t, C) * (1 - smoothing) + smoothing / C  # noqa: E731
    timm_order = -((lam * smooth(y) + (1 - lam) * smooth(y_partner)) * logits.log_softmax(dim=1)).sum(dim=1).mean()
    torch.testing.assert_close(task.loss(logits, mixed.float()), by_hand)
    torch.testing.assert_close(task.loss(logits, mixed.float()), timm_order)
    torch.testing.assert_close(task.loss(logits, F.one_hot(y, C).float()), task.loss(logits, y))


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_with_class_weights_one_hot_and_mixed_targets_keep_the_index_targets_scale(smoothing):
    """Class weights divide a batch's summed loss by sum_i sum_c q_ic w_c (q: the unsmoothed target),
    w_y for a one-hot row: for a mixed batch, whose rows pair each label with the one before,
    sum_i (lam w_y_i + (1 - lam) w_y_i-1) = sum_i w_y_i, the unmixed batch's. Probability targets were
    divided by N instead (index 2.729 vs one-hot 2.473 on one batch), so the scale jumped at mix_off_epoch."""
    generator = torch.Generator().manual_seed(2)
    weights = torch.linspace(0.5, 5.0, C)
    y = torch.tensor([9, 9, 9, 9, 9, 0, 1, 2])
    logits = torch.randn(8, C, generator=generator)
    task = MulticlassTask(C, label_smoothing=smoothing, class_weights=weights)
    torch.testing.assert_close(task.loss(logits, F.one_hot(y, C).float()), task.loss(logits, y))
    for step in (2, 4):  # seed 0 draws CutMix at step 2, MixUp at step 4
        _, soft = BatchMix(C, mixup_alpha=1.0, cutmix_alpha=1.0, seed=0)(constant_batch(), y, 0, step)
        assert 0 < float(soft.max(dim=1).values.min()) < 1  # mixed
        smoothed = (1 - smoothing) * soft + smoothing / C
        by_hand = -(smoothed * weights * logits.log_softmax(dim=1)).sum() / weights[y].sum()
        torch.testing.assert_close(task.loss(logits, soft), by_hand)


def test_soft_targets_reach_the_aux_head_with_its_weight():
    generator = torch.Generator().manual_seed(1)
    main, aux = torch.randn(4, C, generator=generator), torch.randn(4, C, generator=generator)
    soft = torch.softmax(torch.randn(4, C, generator=generator), dim=1)
    task = MulticlassTask(C, label_smoothing=0.1, aux_loss_weight=0.4)
    expected = F.cross_entropy(main, soft, label_smoothing=0.1) + 0.4 * F.cross_entropy(aux, soft, label_smoothing=0.1)
    torch.testing.assert_close(task.loss((main, aux), soft), expected)


class OneHotModel(nn.Module):
    """Its logits are its input (one-hot labels): always right against the hard labels."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 10 + self.unused


def test_top1_counts_against_the_batch_labels_and_the_loss_against_the_mixed_targets():
    labels = torch.arange(8) % C
    batches = [(F.one_hot(labels, C).float(), labels)] * 3
    seen = []

    def partner_targets(inputs, targets, epoch, step):  # every target the neighbour's label: all "wrong"
        seen.append((epoch, step))
        return inputs, F.one_hot(targets.roll(1), C).float()

    model = OneHotModel()
    settings = StepSettings(torch.device("cpu"), mix=partner_targets, log_every=100)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    result = train_one_epoch(model, batches, MulticlassTask(C), optimizer, torch.amp.GradScaler("cpu", enabled=False),
                             settings, first_step=4, epoch=7)
    assert result.metrics["top1"] == 1.0  # against the hard labels
    assert result.metrics["loss"] > 5  # the loss saw the partners' labels
    assert seen == [(7, 4), (7, 5), (7, 6)]  # the epoch, and steps numbered as the loader numbers its batches
    assert result.samples == 24


# --- recipes ---------------------------------------------------------------------------------------------


def test_augment_options_come_from_a_recipe_and_set():
    recipe = load_recipe("inception_v3/imagefolder", ["augment.policy=randaugment", "augment.magnitude=12",
                                                      "augment.mixup_alpha=0.2", "augment.mix_off_epoch=5"])
    assert (recipe.augment.policy, recipe.augment.magnitude, recipe.augment.mix_off_epoch) == ("randaugment", 12, 5)
    assert recipe.augment.mixes and recipe.augment.per_image


@pytest.mark.parametrize("setting,message", [
    ("augment.policy=augmix", "augment.policy='augmix' is not one of none, trivialaugment"),
    ("augment.magnitude=31", "augment.magnitude=31 must be in 0 .. num_magnitude_bins - 1 (30)"),
    ("augment.random_erasing=1.5", "augment.random_erasing=1.5 is a probability"),
    ("augment.cutmix_alpha=-1", "augment.cutmix_alpha=-1.0 must be >= 0"),
    ("augment.interpolation=bicubic", "augment.interpolation='bicubic' is not one of nearest, bilinear"),
])
def test_bad_augment_values_are_one_line_errors_naming_the_key(setting, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_recipe("inception_v3/imagefolder", [setting])


def test_a_policy_on_array_data_and_mixing_on_text_are_refused(tmp_path):
    from inceptionlab.engine.session import build_training_session

    cifar = load_recipe("cifar10/small_cnn", [f"data.root={tmp_path}", "augment.policy=trivialaugment"])
    with pytest.raises(UserError, match="augment.policy and augment.random_erasing act on image folders"):
        build_training_session(cifar)
    imdb = load_recipe("imdb/text_classifier", [f"data.root={tmp_path}", "augment.mixup_alpha=0.2"])
    with pytest.raises(UserError, match="mix the targets of a multiclass task, not task=binary"):
        build_training_session(imdb)  # refused before any data is read (tmp_path holds none)


def test_mixing_a_binary_task_is_refused(tmp_path):
    from test_engine import small_recipe_for

    from inceptionlab.engine.session import build_training_session

    data = make_image_folder(tmp_path / "d", classes=("cat", "dog"), train_per_class=2, val_per_class=1)
    recipe = small_recipe_for(data, "task=binary", "augment.cutmix_alpha=1.0")
    with pytest.raises(UserError, match="mix the targets of a multiclass task, not task=binary"):
        build_training_session(recipe)


@pytest.mark.parametrize("loader", ["resident", "stream", "workers"])
def test_the_session_wires_the_policy_into_the_loader_and_the_mix_into_the_step(loader, tmp_path):
    from test_engine import small_recipe_for
    from torchvision.transforms import v2

    from inceptionlab.data.transforms.device_policy import PolicyAugment
    from inceptionlab.engine.session import build_training_session

    data = make_image_folder(tmp_path / "d", train_per_class=2, val_per_class=1, size=24)
    s = build_training_session(small_recipe_for(data, f"data.loader={loader}", *AUGMENTED))
    assert isinstance(s.settings.mix, BatchMix) and s.settings.mix.off_epoch == 2
    assert (s.settings.mix.mixup_alpha, s.settings.mix.cutmix_alpha) == (0.2, 1.0)
    if loader == "workers":
        names = [type(t).__name__ for t in s.splits.train.transform.transforms]
        assert names[-2:] == ["TrivialAugmentWide", "RandomErasing"]
    else:
        assert isinstance(s.train_loader.augment, PolicyAugment) and s.train_loader.augment.random_erasing == 0.5
        assert isinstance(s.train_loader.augment.policy.transform, v2.TrivialAugmentWide)
        assert not isinstance(s.val_loader.augment, PolicyAugment)  # validation: the plain resize and crop


# --- resume ------------------------------------------------------------------------------------------------

AUGMENTED = ["augment.policy=trivialaugment", "augment.random_erasing=0.5", "augment.mixup_alpha=0.2",
             "augment.cutmix_alpha=1.0", "augment.mix_off_epoch=2", "data.hflip=true", "train.epochs=3"]


@pytest.mark.parametrize("loader", ["resident", "workers"])
def test_training_with_augmentation_resumes_bit_exactly(loader, tmp_path):
    """Stopped in the second epoch and resumed: the same weights as an uninterrupted run, with a policy,
    erasing and MixUp/CutMix (switched off for the third epoch) on the device or worker path."""
    from test_engine import small_recipe_for, state_of

    from inceptionlab.engine.fit import StopSignal, fit

    data = make_image_folder(tmp_path / "d", train_per_class=3, val_per_class=1, size=24)  # 3 steps per epoch
    extra = [f"data.loader={loader}", *AUGMENTED, ONE_THREAD]
    straight = fit(small_recipe_for(data, *extra), tmp_path / "a", progress=False)
    stop, epochs_seen = StopSignal(), [0]

    def stop_in_second_epoch(step, loss):
        epochs_seen[0] += step == 1
        if step == 2 and epochs_seen[0] == 2:
            stop.request()

    stopped = fit(small_recipe_for(data, *extra), tmp_path / "b", progress=False, stop=stop, on_log=stop_in_second_epoch)
    assert stopped.status == "interrupted"
    resumed = fit(small_recipe_for(data, *extra), tmp_path / "b", stopped.run_dir, progress=False)
    a, b = state_of(straight.run_dir / "model.pt"), state_of(resumed.run_dir / "model.pt")
    assert all(torch.equal(a[key], b[key]) for key in a)


@pytest.mark.slow  # torchrun, two processes: 90 s on a busy 2-core machine
def test_two_process_ddp_training_with_augmentation_on_the_device_path(tmp_path):
    """torchrun, 2 ranks on gloo: a policy, erasing and MixUp/CutMix on the resident path train (each
    rank's draws carry its rank: test_draws_are_a_function_of_seed_epoch_rank_step...)."""
    data = make_image_folder(tmp_path / "data", train_per_class=4, val_per_class=1, size=24)
    sets = ["model.name=cifar10_cnn", "model.weights=null", "finetune.body_lr_mult=1", "data.train_crop_size=32", "data.val_resize_size=32",
            "data.val_crop_size=32", "data.num_workers=0", "data.loader=resident", "train.batch_size=3",
            "train.epochs=2", *AUGMENTED[:-1]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "inceptionlab",
           "train", "inception_v3/imagefolder", "--data", str(data), "--out", str(tmp_path / "runs"), "--no-progress",
           "--json", *[x for item in sets for x in ("--set", item)]]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "runs").glob("inception_v3/imagefolder/*")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2] and all(math.isfinite(r["train_loss"]) for r in rows)
    resolved = (run / "recipe.resolved.yaml").read_text()
    assert "policy: trivialaugment" in resolved and "cutmix_alpha: 1.0" in resolved
