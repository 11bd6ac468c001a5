"""The device path's TrivialAugmentWide / RandAugment / AutoAugment / RandomErasing equal torchvision's:
each batched operation gives torchvision's per-image bytes for the same operation and magnitude, the
draws follow torchvision's distribution (a chi-square test, and a check that it rejects a policy drawn
slightly wrong), and the whole device step is crop -> policy -> erasing -> normalise."""

from __future__ import annotations

import functools
import math
from collections import Counter

import pytest
import torch
from scipy import stats
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from inceptionlab.config import AugmentConfig
from inceptionlab.data.transforms.device import DeviceAugment
from inceptionlab.data.transforms.device_ops import OPS
from inceptionlab.data.transforms.device_policy import PolicyAugment, apply_rounds, erase
from inceptionlab.data.transforms.host import train_transform
from inceptionlab.data.transforms.policies import (BatchPolicy, batch_policy, derived_seed, mean_levels, sample_erasing,
                                                   torchvision_policy)

ALPHA = 0.001  # significance of every distribution test here
N = 48


def noise_and_smooth_images(n: int, height: int, width: int, seed: int) -> torch.Tensor:
    """Half uniform noise, half smooth gradients (few distinct values: equalize and autocontrast differ)."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randint(0, 256, (n // 2, 3, height, width), dtype=torch.uint8, generator=generator)
    coarse = torch.randint(0, 256, (n - n // 2, 3, 5, 5), generator=generator).float()
    smooth = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear").round().to(torch.uint8)
    return torch.cat([noise, smooth])


def magnitudes_for(name: str, n: int, seed: int) -> torch.Tensor:
    """Signed magnitudes over (beyond) every policy's range; float32 values, as torchvision's tables hold."""
    generator = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=generator, dtype=torch.float64)
    ranges = {"TranslateX": 40.0, "TranslateY": 40.0, "Rotate": 140.0, "Solarize": 1.0}
    if name == "Posterize":
        return torch.randint(0, 9, (n,), generator=generator).double()
    if name == "Solarize":
        values = u
    elif name == "Rotate":  # torchvision's quarter-turn shortcuts (0, +-90, 180, 270) beside arbitrary angles
        values = torch.where(u < 0.4, torch.tensor([0.0, 90.0, -90.0, 180.0, 270.0], dtype=torch.float64)[(u * 12).long() % 5],
                             (2 * u - 1) * ranges["Rotate"])
    else:
        values = (2 * u - 1) * ranges.get(name, 0.99)
    return values.float().double()


def torchvision_op(image: torch.Tensor, name: str, magnitude: float, interpolation: str) -> torch.Tensor:
    """What torchvision's policies run for one image (the method every policy class shares)."""
    return v2.TrivialAugmentWide()._apply_image_or_video_transform(
        image, name, magnitude, v2.InterpolationMode(interpolation), {"others": None})


EXACT = {"Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Posterize", "Solarize",
         "AutoContrast", "Equalize", "Invert"}


GEOMETRIC = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"}  # the ones interpolation matters to
CASES = [(name, "bilinear") for name in sorted(OPS)] + [(name, "nearest") for name in sorted(GEOMETRIC)]


@pytest.mark.parametrize("name,interpolation", CASES)
def test_each_batched_operation_equals_torchvision_per_image(name, interpolation):
    """Every sample its own magnitude, one call for the batch; torchvision one image at a time. The
    geometric and bit operations give its bytes; the float blends (Brightness, Color, Contrast,
    Sharpness) are allowed one level (a fused multiply-add may round differently on other devices;
    exact on the AMD EPYC this was written on)."""
    images = noise_and_smooth_images(N, 37, 41, seed=1)
    magnitudes = magnitudes_for(name, N, seed=2)
    ours = OPS[name](images, magnitudes, interpolation)
    assert ours.dtype == torch.uint8 and ours.shape == images.shape
    theirs = torch.stack([torchvision_op(images[k], name, float(magnitudes[k]), interpolation) for k in range(N)])
    difference = (ours.int() - theirs.int()).abs()
    if name in EXACT:
        assert torch.equal(ours, theirs)
    else:
        assert int(difference.max()) <= 1 and float((difference > 0).float().mean()) < 1e-3
    if name not in {"Identity"}:
        assert not torch.equal(ours, images)  # the operation did something


def test_rotation_of_a_non_square_batch_uses_the_warp_for_quarter_turns():
    """torchvision's rot90 shortcut for 90/270 degrees holds for square images only."""
    images = noise_and_smooth_images(4, 20, 30, seed=3)
    magnitudes = torch.tensor([90.0, -90.0, 180.0, 0.0], dtype=torch.float64)
    ours = OPS["Rotate"](images, magnitudes, "nearest")
    theirs = torch.stack([torchvision_op(images[k], "Rotate", float(magnitudes[k]), "nearest") for k in range(4)])
    assert torch.equal(ours, theirs)


# --- the draws -----------------------------------------------------------------------------------------

DRAWS = 5_000  # ~0.4 ms per torchvision call (Python): ~2 s per policy on a 2-core AMD EPYC
SIZE = 299  # the translations of RandAugment/AutoAugment scale with the image: draw at the training size


@functools.cache
def torchvision_draws_for(name: str) -> list[tuple]:
    return torchvision_draws(torchvision_policy(POLICIES[name]), DRAWS)


def torchvision_draws(transform: v2.Transform, draws: int, seed: int = 0) -> list[tuple]:
    """The (operation, signed magnitude) sequence torchvision's class applies to each of `draws` images.
    Its draws do not depend on the pixels, so the operations are recorded instead of run."""
    recorded: list[list[tuple[str, float]]] = []

    def record(image, transform_id, magnitude, interpolation, fill):
        recorded[-1].append((transform_id, magnitude))
        return image

    transform._apply_image_or_video_transform = record  # an instance attribute shadows the method
    image = torch.zeros(3, SIZE, SIZE, dtype=torch.uint8)
    torch.manual_seed(seed)
    for _ in range(draws):
        recorded.append([])
        transform(image)
    return [_without_identity(r) for r in recorded]


def _without_identity(ops: list[tuple[str, float]]) -> tuple:
    """AutoAugment records only the operations that run; ours marks the others Identity. Dropping
    Identity from both keeps the information (an image with no operation is the empty tuple)."""
    return tuple((name, magnitude) for name, magnitude in ops if name != "Identity")


def our_draws(policy: BatchPolicy, draws: int, seed: int = 7) -> list[tuple]:
    rounds = policy.draw(draws, SIZE, SIZE, torch.Generator().manual_seed(seed))
    return [_without_identity([(r.ops[k], float(r.magnitudes[k])) for r in rounds]) for k in range(draws)]


def chi_square_p(a: list, b: list) -> float:
    """Homogeneity of two samples of categories (chi-square on their 2 x K table; categories seen fewer
    than 10 times in both pooled, so every expected count is large enough)."""
    ca, cb = Counter(a), Counter(b)
    keys = sorted(set(ca) | set(cb), key=repr)
    big = [k for k in keys if ca[k] + cb[k] >= 10]
    rest = [k for k in keys if ca[k] + cb[k] < 10]
    table = [[ca[k] for k in big] + [sum(ca[k] for k in rest)], [cb[k] for k in big] + [sum(cb[k] for k in rest)]]
    columns = [column for column in zip(*table) if sum(column) > 0]
    if len(columns) < 2:
        return 1.0  # one category in both samples: nothing differs
    return float(stats.chi2_contingency(list(zip(*columns)))[1])


def same_distribution(ours: list[tuple], theirs: list[tuple]) -> bool:
    """The joint draws per image, each operation's share, and the signs: all homogeneous at ALPHA."""
    ops = lambda draws: [name for d in draws for name, _ in d] or ["none"]  # noqa: E731
    signs = lambda draws: [(name, math.copysign(1, m)) for d in draws for name, m in d if m]  # noqa: E731
    return all(chi_square_p(f(ours), f(theirs)) > ALPHA for f in (lambda d: d, ops, signs))


POLICIES = {
    "trivialaugment": AugmentConfig(policy="trivialaugment"),
    "trivialaugment_8_bins": AugmentConfig(policy="trivialaugment", num_magnitude_bins=8, magnitude=3),
    "randaugment": AugmentConfig(policy="randaugment"),
    "randaugment_1_op_level_20": AugmentConfig(policy="randaugment", num_ops=1, magnitude=20),
    "autoaugment_imagenet": AugmentConfig(policy="autoaugment"),
    "autoaugment_cifar10": AugmentConfig(policy="autoaugment", autoaugment_policy="cifar10"),
    "autoaugment_svhn": AugmentConfig(policy="autoaugment", autoaugment_policy="svhn"),
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policy_draws_follow_torchvisions_distribution(name):
    theirs = torchvision_draws_for(name)
    ours = our_draws(batch_policy(POLICIES[name]), DRAWS)
    assert same_distribution(ours, theirs)
    assert len(set(theirs)) > 20  # many outcomes: the test compares a real distribution


def test_the_draw_test_rejects_a_policy_missing_one_operation():
    """Power: TrivialAugmentWide drawn from 13 of its 14 operations (Identity left out: each other one
    1/13 instead of 1/14 of the time) fails the same test."""
    theirs = torchvision_draws_for("trivialaugment")
    wrong = torchvision_policy(POLICIES["trivialaugment"])
    wrong._AUGMENTATION_SPACE = {k: v for k, v in wrong._AUGMENTATION_SPACE.items() if k != "Identity"}
    assert not same_distribution(our_draws(BatchPolicy(wrong), DRAWS), theirs)


def test_the_draw_test_rejects_signs_drawn_60_40():
    """Power: the same operations and levels with the minus sign drawn 60% of the time."""
    theirs = torchvision_draws_for("randaugment")
    ours = our_draws(batch_policy(POLICIES["randaugment"]), DRAWS)
    generator = torch.Generator().manual_seed(1)
    skewed = [tuple((n, -abs(m) if m and torch.rand((), generator=generator) < 0.6 else abs(m)) for n, m in d)
              for d in ours]
    assert not same_distribution(skewed, theirs)


# --- random erasing ----------------------------------------------------------------------------------

ERASE_DRAWS = 6000


def torchvision_erasing(height: int, width: int, p: float, draws: int, scale=(0.02, 0.33)) -> torch.Tensor:
    """(erased?, top, left, height, width) per draw from RandomErasing's own parameter draws."""
    transform = v2.RandomErasing(p=p, scale=scale)
    image = torch.zeros(3, height, width)
    torch.manual_seed(11)
    rows = []
    for _ in range(draws):
        applied = bool(torch.rand(1) < p)  # _RandomApplyTransform: skipped when rand >= p
        params = transform.make_params([image])
        rows.append([applied and params["v"] is not None, params["i"], params["j"], params["h"], params["w"]])
    return torch.tensor(rows)


def our_erasing(height: int, width: int, p: float, draws: int, scale=(0.02, 0.33)) -> torch.Tensor:
    boxes = sample_erasing(draws, height, width, p, torch.Generator().manual_seed(5), scale=scale)
    return torch.stack([boxes.erase.long(), boxes.top, boxes.left, boxes.height, boxes.width], dim=1)


def erasing_p_values(ours: torch.Tensor, theirs: torch.Tensor) -> list[float]:
    erased_share = chi_square_p(ours[:, 0].tolist(), theirs[:, 0].tolist())
    a, b = ours[ours[:, 0] == 1], theirs[theirs[:, 0] == 1]
    features = [lambda t: t[:, 1], lambda t: t[:, 2], lambda t: t[:, 3], lambda t: t[:, 4], lambda t: t[:, 3] * t[:, 4]]
    return [float(erased_share)] + [float(stats.ks_2samp(f(a).numpy(), f(b).numpy()).pvalue) for f in features]


@pytest.mark.parametrize("height,width,p", [(299, 299, 0.5), (40, 90, 0.25), (12, 12, 1.0)])
def test_erasing_boxes_follow_torchvisions_distribution(height, width, p):
    ours, theirs = our_erasing(height, width, p, ERASE_DRAWS), torchvision_erasing(height, width, p, ERASE_DRAWS)
    assert min(erasing_p_values(ours, theirs)) > ALPHA / 6  # Bonferroni over the six tests
    erased = ours[ours[:, 0] == 1]
    assert (erased[:, 1] + erased[:, 3] <= height).all() and (erased[:, 2] + erased[:, 4] <= width).all()


def test_the_erasing_test_rejects_a_wrong_area_range():
    """Power: boxes of 5-33% of the area instead of 2-33% fail it."""
    ours = our_erasing(299, 299, 0.5, ERASE_DRAWS, scale=(0.05, 0.33))
    theirs = torchvision_erasing(299, 299, 0.5, ERASE_DRAWS)
    assert min(erasing_p_values(ours, theirs)) < ALPHA / 6


def test_batched_erase_equals_torchvisions_per_image():
    images = noise_and_smooth_images(16, 30, 40, seed=4)
    boxes = sample_erasing(16, 30, 40, 0.6, torch.Generator().manual_seed(2))
    fill = torch.tensor([124.0, 116.0, 104.0])
    ours = erase(images, boxes, fill)
    for k in range(16):
        expected = images[k]
        if boxes.erase[k]:
            expected = F.erase(images[k], int(boxes.top[k]), int(boxes.left[k]), int(boxes.height[k]),
                               int(boxes.width[k]), fill.view(3, 1, 1))
        assert torch.equal(ours[k], expected)
    assert boxes.erase.any() and not boxes.erase.all()


def test_erasing_fills_the_mean_colour_level():
    assert mean_levels([0.485, 0.456, 0.406]) == [124.0, 116.0, 104.0]


# --- the whole device step and the worker path -----------------------------------------------------------

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.mark.parametrize("policy", ["trivialaugment", "randaugment", "autoaugment"])
def test_device_step_is_crop_then_torchvisions_policy_then_erasing_then_normalisation(policy):
    """PolicyAugment's output equals: its crop (DeviceAugment's boxes and flips, rounded to uint8), then
    torchvision's operation for each image's drawn operation and magnitude, then F.erase, then
    normalisation: the order and the draws the loaders get."""
    sources = noise_and_smooth_images(12, 48, 48, seed=6)
    sizes = torch.full((12,), 48)
    crop = DeviceAugment(40, MEAN, STD, hflip=True)
    cfg = AugmentConfig(policy=policy, random_erasing=0.5)
    augment = PolicyAugment(crop, batch_policy(cfg), cfg.random_erasing)
    out = augment(sources, sizes, sizes, torch.Generator().manual_seed(9))
    assert out.shape == (12, 3, 40, 40) and out.dtype == torch.float32

    raw = DeviceAugment(40, (0.0,) * 3, (1 / 255,) * 3, hflip=True)(sources, sizes, sizes, torch.Generator().manual_seed(9))
    pixels = raw.round().clamp(0, 255).to(torch.uint8)
    host = torch.Generator().manual_seed(derived_seed("augment", 9))
    rounds = batch_policy(cfg).draw(12, 40, 40, host)
    boxes = sample_erasing(12, 40, 40, 0.5, host)
    for k in range(12):
        image = pixels[k]
        for step in rounds:
            image = torchvision_op(image, step.ops[k], float(step.magnitudes[k]), cfg.interpolation)
        if boxes.erase[k]:
            image = F.erase(image, int(boxes.top[k]), int(boxes.left[k]), int(boxes.height[k]), int(boxes.width[k]),
                            torch.tensor(mean_levels(MEAN)).view(3, 1, 1))
        expected = F.normalize(image.float() / 255, MEAN, STD)
        torch.testing.assert_close(out[k], expected, rtol=0, atol=1e-5)


def test_device_step_keeps_the_crops_and_flips_of_the_plain_path_and_its_output_format():
    """With a policy that never runs (magnitude-free Identity only) and no erasing, the output is the
    plain DeviceAugment's within the rounding to uint8 levels; dtype and memory format follow it."""
    sources = noise_and_smooth_images(6, 32, 32, seed=8)
    sizes = torch.full((6,), 32)
    crop = DeviceAugment(36, MEAN, STD, hflip=True, dtype=torch.bfloat16, channels_last=True)
    identity_only = v2.RandAugment(num_ops=0)
    out = PolicyAugment(crop, BatchPolicy(identity_only))(sources, sizes, sizes, torch.Generator().manual_seed(1))
    plain = crop(sources, sizes, sizes, torch.Generator().manual_seed(1))
    assert out.dtype == torch.bfloat16 and out.is_contiguous(memory_format=torch.channels_last)
    half_level = 0.5 / (min(STD) * 255)
    assert float((out.float() - plain.float()).abs().max()) < half_level + 0.03  # + bf16 rounding of values ~2


def test_apply_rounds_leaves_its_input_alone():
    images = noise_and_smooth_images(8, 16, 16, seed=9)
    before = images.clone()
    apply_rounds(images, batch_policy(AugmentConfig(policy="trivialaugment")), torch.Generator().manual_seed(0))
    assert torch.equal(images, before)


def test_worker_path_runs_torchvisions_transforms_in_the_recipes_order():
    from inceptionlab.config import DataConfig

    data = DataConfig(train_crop_size=64, interpolation="bilinear", mean=list(MEAN), std=list(STD), hflip=True)
    steps = train_transform(data, AugmentConfig(policy="randaugment", num_ops=3, magnitude=5,
                                                random_erasing=0.25, interpolation="nearest")).transforms
    assert [type(s).__name__ for s in steps] == ["ToImage", "RandomResizedCrop", "RandomHorizontalFlip", "RandAugment",
                                                  "RandomErasing"]
    assert (steps[3].num_ops, steps[3].magnitude, steps[3].interpolation) == (3, 5, v2.InterpolationMode.NEAREST)
    assert steps[4].p == 0.25 and steps[4].value == [124.0, 116.0, 104.0]
    assert [type(s).__name__ for s in train_transform(data, AugmentConfig()).transforms][-1] == "RandomHorizontalFlip"
    out = v2.Compose(steps)(torch.randint(0, 256, (3, 80, 90), dtype=torch.uint8))
    assert out.dtype == torch.uint8 and out.shape == (3, 64, 64)


def test_per_image_and_whole_batch_execution_give_the_same_bytes():
    """A CPU applies each operation one image at a time (cache), a GPU to all that drew it at once."""
    images = noise_and_smooth_images(24, 33, 29, seed=10)
    policy = batch_policy(AugmentConfig(policy="trivialaugment"))
    one_by_one = apply_rounds(images, policy, torch.Generator().manual_seed(4), per_image=True)
    together = apply_rounds(images, policy, torch.Generator().manual_seed(4), per_image=False)
    assert torch.equal(one_by_one, together) and not torch.equal(together, images)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
@pytest.mark.parametrize("policy", ["trivialaugment", "randaugment", "autoaugment"])
def test_the_device_step_on_a_gpu_waits_for_nothing_and_matches_the_cpu(policy):
    """On a GPU: no call in the step makes the host wait for the device (sync debug mode raises on
    one), and the bytes after the policy equal the CPU's (within one level: GPU kernels round blends
    their own way; the geometric ones may pick another neighbour where a coordinate is a tie)."""
    device = torch.device("cuda")
    sources = noise_and_smooth_images(16, 64, 64, seed=12)
    sizes = torch.full((16,), 64)
    crop = DeviceAugment(96, MEAN, STD, hflip=True)
    augment = PolicyAugment(crop, batch_policy(AugmentConfig(policy=policy)), 0.5)
    cpu = augment(sources, sizes, sizes, torch.Generator().manual_seed(3))
    on_device = sources.to(device), sizes.to(device), sizes.to(device)
    augment(*on_device, torch.Generator(device=device).manual_seed(3))  # first call: constants, kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        gpu = augment(*on_device, torch.Generator(device=device).manual_seed(3))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert gpu.shape == cpu.shape and gpu.device.type == "cuda"
    # The crops' draws come from each device's own generator, so compare the policy alone on one crop:
    pixels = noise_and_smooth_images(16, 48, 48, seed=13)
    rounds = batch_policy(AugmentConfig(policy=policy))
    on_cpu = apply_rounds(pixels, rounds, torch.Generator().manual_seed(5))
    on_gpu = apply_rounds(pixels.to(device), rounds, torch.Generator().manual_seed(5)).cpu()
    difference = (on_cpu.int() - on_gpu.int()).abs()
    assert float((difference > 1).float().mean()) < 1e-3
