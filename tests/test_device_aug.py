"""On-device augmentation equals torchvision's, and the resident image loader resumes bit-exactly."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as TF
from torch.utils.data import Subset
from conftest import ONE_THREAD, make_image_folder
from torchvision.transforms import RandomResizedCrop, v2
from torchvision.transforms.v2 import functional as F

from inceptionlab.data.datasets.imagefolder import RobustImageFolder
from inceptionlab.data.loading import decoded_cache, resident
from inceptionlab.data.loading.image_options import DeviceImageOptions
from inceptionlab.data.loading.loaders import make_loader
from inceptionlab.data.loading.resident import ResidentImageLoader
from inceptionlab.data.loading.streamed import StreamImageLoader
from inceptionlab.data.loading.workers import SkipTrackingLoader
from inceptionlab.data.transforms.device import (Boxes, DeviceAugment, axis_weights, banded_matmul, pass_normalised, resample,
                                                 row_taps, sample_crop_params)
from inceptionlab.models.spec import Normalize

DRAWS = 4000


def ks_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    values = torch.cat([a, b]).double().unique()
    cdf = lambda x: torch.searchsorted(x.double().sort().values, values, right=True) / len(x)  # noqa: E731
    return float((cdf(a) - cdf(b)).abs().max())


def torchvision_boxes(height: int, width: int, scale, ratio, draws: int) -> torch.Tensor:
    image = torch.zeros(1, height, width)
    torch.manual_seed(123)
    return torch.tensor([RandomResizedCrop.get_params(image, list(scale), list(ratio)) for _ in range(draws)])


def our_boxes(height: int, width: int, scale, ratio, draws: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    boxes = sample_crop_params(generator, torch.full((draws,), height), torch.full((draws,), width), scale, ratio)
    return torch.stack([boxes.top, boxes.left, boxes.height, boxes.width], dim=1)


@pytest.mark.parametrize("height,width,scale", [(64, 64, (0.08, 1.0)), (48, 120, (0.08, 1.0)), (64, 64, (0.5, 1.0))])
def test_crop_parameters_follow_torchvisions_distribution(height, width, scale):
    ratio = (3 / 4, 4 / 3)
    ours, theirs = our_boxes(height, width, scale, ratio, DRAWS), torchvision_boxes(height, width, scale, ratio, DRAWS)
    # KS critical value at alpha = 0.001 for two samples of 4000: 1.95 * sqrt(2 / 4000) = 0.044.
    limit = 1.95 * math.sqrt(2 / DRAWS)
    features = {
        "top": lambda b: b[:, 0], "left": lambda b: b[:, 1], "height": lambda b: b[:, 2], "width": lambda b: b[:, 3],
        "area": lambda b: b[:, 2] * b[:, 3], "log_ratio": lambda b: torch.log(b[:, 3] / b[:, 2]),
    }
    for name, feature in features.items():
        assert ks_distance(feature(ours), feature(theirs)) < limit, name
    assert (ours[:, 0] + ours[:, 2] <= height).all() and (ours[:, 1] + ours[:, 3] <= width).all()


def test_a_shifted_distribution_is_detected():
    """The KS check above has power: scale (0.3, 1) instead of (0.08, 1) fails it."""
    ours = our_boxes(64, 64, (0.3, 1.0), (3 / 4, 4 / 3), DRAWS)
    theirs = torchvision_boxes(64, 64, (0.08, 1.0), (3 / 4, 4 / 3), DRAWS)
    assert ks_distance(ours[:, 2] * ours[:, 3], theirs[:, 2] * theirs[:, 3]) > 1.95 * math.sqrt(2 / DRAWS)


@pytest.mark.parametrize("height,width", [(8, 200), (200, 8), (30, 30)])
def test_fallback_is_torchvisions_central_crop(height, width):
    """No box can fit in 10 attempts (scale > 1 of the area): both fall back to the same central crop."""
    scale, ratio = (1.5, 2.0), (3 / 4, 4 / 3)
    ours = our_boxes(height, width, scale, ratio, 5)
    theirs = torchvision_boxes(height, width, scale, ratio, 5)
    assert torch.equal(ours, theirs)


def test_first_fitting_attempt_wins():
    """A very wide ratio range on a square image fails some attempts; all boxes still fit and vary."""
    boxes = our_boxes(32, 32, (0.9, 1.0), (0.2, 5.0), 500)
    assert ((boxes[:, 2] <= 32) & (boxes[:, 3] <= 32)).all()
    assert len(boxes[:, 2:].unique(dim=0)) > 5


def random_images(n: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, height, width), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_pixels_match_torchvision_resized_crop_bilinear():
    images = random_images(8, 48, 64)
    boxes = sample_crop_params(torch.Generator().manual_seed(3), torch.full((8,), 48), torch.full((8,), 64))
    ours = resample(images, boxes, 75, antialias=False)
    for n in range(8):
        box = [int(boxes.top[n]), int(boxes.left[n]), int(boxes.height[n]), int(boxes.width[n])]
        theirs = F.resized_crop(images[n], *box, [75, 75], interpolation=v2.InterpolationMode.BILINEAR, antialias=False)
        assert (ours[n].round() - theirs.float()).abs().max() <= 1  # as uint8: within one level
        cropped = images[n : n + 1, :, box[0] : box[0] + box[2], box[1] : box[1] + box[3]].float()
        exact = TF.interpolate(cropped, size=(75, 75), mode="bilinear", align_corners=False)[0]
        assert (ours[n] - exact).abs().max() < 0.01  # torchvision's uint8 kernel is the one rounding


def test_downscaled_crops_match_torchvision_antialias():
    images = random_images(2, 120, 100)
    boxes = Boxes(torch.tensor([3, 0]), torch.tensor([5, 10]), torch.tensor([110, 120]), torch.tensor([90, 60]))
    ours = resample(images, boxes, 40, antialias=True)
    for n in range(2):
        box = [int(boxes.top[n]), int(boxes.left[n]), int(boxes.height[n]), int(boxes.width[n])]
        theirs = F.resized_crop(images[n], *box, [40, 40], antialias=True)
        assert (ours[n].round() - theirs.float()).abs().max() <= 1


@pytest.mark.parametrize("flip", [None, torch.tensor([True, False, True])])
def test_nchw_output_is_written_directly_with_the_same_values(flip):
    """channels_last=False: the same pixels as the channels_last result, already contiguous NCHW (the
    model's layout), so nothing converts a 299 px batch afterwards."""
    images = random_images(3, 48, 40).float()
    boxes = sample_crop_params(torch.Generator().manual_seed(2), torch.full((3,), 48), torch.full((3,), 40))
    nhwc = resample(images, boxes, 75, flip=flip)
    nchw = resample(images, boxes, 75, flip=flip, channels_last=False)
    assert nhwc.is_contiguous(memory_format=torch.channels_last) and not nhwc.is_contiguous()
    assert nchw.is_contiguous() and nchw.shape == nhwc.shape == (3, 3, 75, 75)
    torch.testing.assert_close(nchw, nhwc, rtol=0, atol=1e-3)


def test_flip_reverses_columns_only_where_asked():
    images = random_images(4, 32, 32)
    boxes = sample_crop_params(torch.Generator().manual_seed(5), torch.full((4,), 32), torch.full((4,), 32))
    flip = torch.tensor([True, False, True, False])
    plain, flipped = resample(images, boxes, 40), resample(images, boxes, 40, flip=flip)
    assert torch.equal(flipped[0], plain[0].flip(-1)) and torch.equal(flipped[1], plain[1])


def test_eval_resize_and_centre_crop_match_torchvision_per_sample_sizes():
    """Sources of different sizes, padded into one tensor, each equal torchvision's Resize + CenterCrop."""
    sizes = [(40, 40), (30, 52), (56, 33)]
    sources = [random_images(1, h, w, seed=i)[0] for i, (h, w) in enumerate(sizes)]
    padded = torch.zeros(3, 3, 56, 52, dtype=torch.uint8)
    for n, image in enumerate(sources):
        padded[n, :, : image.shape[1], : image.shape[2]] = image
    augment = DeviceAugment(36, mean=[0, 0, 0], std=[1 / 255] * 3, train=False, resize_size=45)
    ours = augment(padded, torch.tensor([h for h, _ in sizes]), torch.tensor([w for _, w in sizes]))
    reference = v2.Compose([v2.Resize(45, antialias=True), v2.CenterCrop(36)])
    for n, image in enumerate(sources):
        assert (ours[n] - reference(image).float()).abs().max() <= 1  # ours are rounded to uint8 levels too


def test_training_batch_is_normalised_bf16_channels_last():
    images = random_images(4, 64, 64)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    sizes = torch.full((4,), 64)
    fast = DeviceAugment(75, mean, std, dtype=torch.bfloat16, channels_last=True, hflip=True)
    out = fast(images, sizes, sizes, torch.Generator().manual_seed(0))
    assert out.dtype == torch.bfloat16 and out.is_contiguous(memory_format=torch.channels_last)
    # The same draws, resampled in fp32 from uint8 and normalised afterwards, as the worker path would.
    generator = torch.Generator().manual_seed(0)
    boxes = sample_crop_params(generator, sizes, sizes)
    flip = torch.rand(4, generator=generator) < 0.5
    reference = Normalize(mean, std)(resample(images, boxes, 75, flip=flip))
    assert (out.float() - reference).abs().max() < 0.05  # bf16: 8 bits of mantissa on values up to ~2.6


def test_pass_normalised_leaves_floats_and_normalises_uint8():
    normalise = Normalize([0.5] * 3, [0.25] * 3)
    prepare = pass_normalised(normalise)
    floats = torch.randn(1, 3, 4, 4)
    assert prepare(floats) is floats
    pixels = random_images(1, 4, 4)
    assert torch.equal(prepare(pixels), normalise(pixels))


# --- cache and loader ----------------------------------------------------------------------------


@pytest.fixture
def folder(tmp_path):
    return make_image_folder(tmp_path / "data", train_per_class=5, val_per_class=2, size=24)


def options(**overrides) -> DeviceImageOptions:
    return DeviceImageOptions(**{"train_size": 32, "val_resize_size": 32, "val_crop_size": 28, **overrides})


def test_cache_is_reused_and_rebuilt_when_a_file_changes(folder, monkeypatch):
    split = RobustImageFolder(folder / "train")
    first = decoded_cache.load_or_build(split.samples, folder / "train", 64)
    tensor_path, manifest_path = decoded_cache.cache_paths(folder / "train", 64)
    assert tensor_path.is_file() and manifest_path.is_file()
    assert first.images.shape == (15, 3, 24, 24) and first.unreadable == []
    decodes = []
    real_decode = decoded_cache.decode_split
    monkeypatch.setattr(decoded_cache, "decode_split", lambda *a, **k: decodes.append(1) or real_decode(*a, **k))
    again = decoded_cache.load_or_build(split.samples, folder / "train", 64)
    assert decodes == [] and torch.equal(again.images, first.images)
    changed = folder / "train" / "cat" / "cat_0.png"
    from PIL import Image

    Image.new("RGB", (24, 24), (1, 2, 3)).save(changed)
    os.utime(changed, ns=(1, 1))  # a different mtime even on coarse-clock file systems
    rebuilt = decoded_cache.load_or_build(split.samples, folder / "train", 64)
    assert decodes == [1]
    index = [path for path, _ in split.samples].index(str(changed))
    assert rebuilt.images[index, :, 0, 0].tolist() == [1, 2, 3]


def test_large_images_shrink_to_keep_their_shorter_side_at_the_cache_size(tmp_path):
    data = make_image_folder(tmp_path / "d", train_per_class=1, val_per_class=1, size=24)
    from PIL import Image

    Image.new("RGB", (80, 40), (9, 9, 9)).save(data / "train" / "cat" / "wide.png")
    Image.new("RGB", (40, 200), (9, 9, 9)).save(data / "train" / "cat" / "tall.png")  # beyond 2:1: the longer side decides
    split = RobustImageFolder(data / "train")
    cache = decoded_cache.load_or_build(split.samples, data / "train", 32)
    paths = [path for path, _ in split.samples]
    wide, tall = paths.index(str(data / "train" / "cat" / "wide.png")), paths.index(str(data / "train" / "cat" / "tall.png"))
    assert (int(cache.heights[wide]), int(cache.widths[wide])) == (32, 64)
    assert (int(cache.heights[tall]), int(cache.widths[tall])) == (64, 13)  # stored turned: 13 x 64
    assert cache.images.shape[-2:] == (32, 64)


def test_corrupt_files_are_counted_and_named(folder):
    broken = folder / "train" / "dog" / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    loader = make_loader(RobustImageFolder(folder / "train"), batch_size=4, train=True, seed=0, num_workers=0,
                         images=options(), mode="resident")
    assert isinstance(loader, ResidentImageLoader)
    assert loader.skipped == [str(broken)]
    loader.set_epoch(0)
    assert sum(len(t) for _, t in loader) == 12  # the 15 readable images, the broken one left out: 3 full batches


def test_auto_picks_resident_when_it_fits_and_stream_otherwise(folder, monkeypatch):
    split = RobustImageFolder(folder / "train")
    common = dict(batch_size=4, train=True, seed=0, num_workers=0, images=options())
    assert isinstance(make_loader(split, mode="auto", **common), ResidentImageLoader)
    assert type(make_loader(split, mode="workers", **common)) is SkipTrackingLoader
    monkeypatch.setattr(resident, "MEMORY_SHARE", 0.0)
    assert isinstance(make_loader(split, mode="auto", **common), StreamImageLoader)
    assert isinstance(make_loader(split, mode="resident", **common), ResidentImageLoader)


def test_a_small_sample_is_decoded_alone_and_equals_the_cached_split(folder):
    split = RobustImageFolder(folder / "train")
    sample = Subset(split, [1, 4, 9, 12])  # what data.max_train_samples hands the loader
    common = dict(batch_size=4, train=True, seed=0, num_workers=0, images=options(hflip=True), mode="resident")
    alone = make_loader(sample, **common)
    tensor_path, manifest_path = decoded_cache.cache_paths(folder / "train", 342)
    assert not tensor_path.exists() and not manifest_path.exists()  # 4 of 15 images: no cache of all 15
    decoded_cache.load_or_build(split.samples, folder / "train", 342)
    cached = make_loader(sample, **common)  # a current cache exists now: the sample is taken from it
    for loader in (alone, cached):
        loader.set_epoch(1)
    (x, y), (u, v) = next(iter(alone)), next(iter(cached))
    assert torch.equal(x, u) and torch.equal(y, v)
    assert sorted(y.tolist()) == sorted(split.targets[i] for i in sample.indices)


def test_mid_epoch_start_replays_the_same_batches(folder):
    loader = make_loader(RobustImageFolder(folder / "train"), batch_size=4, train=True, seed=3, num_workers=0,
                         images=options(hflip=True), mode="resident")
    loader.set_epoch(2)
    full = list(loader)
    loader.set_epoch(2, start=8)
    tail = list(loader)
    assert len(full) == 3 and len(tail) == 1  # 15 images: 3 full batches (training drops the partial one)
    for (x, y), (u, v) in zip(full[2:], tail):
        assert torch.equal(x, u) and torch.equal(y, v)
    loader.set_epoch(3)
    assert not torch.equal(next(iter(loader))[0], full[0][0])  # another epoch: other order and boxes
    x, y = full[0]
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32


def test_validation_batches_are_deterministic_and_cover_the_split(folder):
    loader = make_loader(RobustImageFolder(folder / "val"), batch_size=4, train=False, seed=0, num_workers=0,
                         images=options(), mode="resident")
    loader.set_epoch(0)
    first, second = list(loader), list(loader)
    assert [len(t) for _, t in first] == [4, 2]
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, second))
    assert first[0][0].shape == (4, 3, 28, 28)


def test_training_resumes_bit_exactly_with_the_resident_image_loader(folder, tmp_path):
    from test_engine import SMALL_CNN, recipe_for, state_of

    from inceptionlab.engine.fit import StopSignal, fit

    extra = [*SMALL_CNN, "data.loader=resident", "data.hflip=true", ONE_THREAD]
    straight = fit(recipe_for(folder, *extra), tmp_path / "a", progress=False)
    stop, epochs_seen = StopSignal(), [0]

    def stop_in_second_epoch(step, loss):
        epochs_seen[0] += step == 1
        if step == 2 and epochs_seen[0] == 2:
            stop.request()

    stopped = fit(recipe_for(folder, *extra), tmp_path / "b", progress=False, stop=stop, on_log=stop_in_second_epoch)
    assert stopped.status == "interrupted"
    resumed = fit(recipe_for(folder, *extra), tmp_path / "b", stopped.run_dir, progress=False)
    a, b = state_of(straight.run_dir / "model.pt"), state_of(resumed.run_dir / "model.pt")
    assert all(torch.equal(a[key], b[key]) for key in a)


@pytest.mark.parametrize("size", [24, 64, 97])
def test_sparse_upscale_weights_equal_the_dense_ones_bit_for_bit(size):
    """The CPU shortcut for scale <= 1 (three candidate taps, scattered) gives the dense matrix exactly."""
    from inceptionlab.data.transforms.device import _dense_weights, _upscale_weights

    generator = torch.Generator().manual_seed(size)
    heights, widths = torch.randint(4, size + 1, (64,), generator=generator), torch.full((64,), size)
    boxes = sample_crop_params(generator, heights, widths)
    for offset, out_size in ((0, 299), (0, 150), (0, 97)):
        scale = boxes.height.double() / out_size
        assert bool((scale <= 1).all())
        k = torch.arange(out_size, dtype=torch.float64)
        center = ((k[None, :] + offset + 0.5) * scale[:, None]).float()[:, :, None]
        sparse = _upscale_weights(center, boxes.top, boxes.height, size)
        dense = _dense_weights(center, boxes.top, boxes.height, scale, size, antialias=True)
        assert torch.equal(sparse, dense)
        assert torch.allclose(dense.sum(dim=2), torch.ones(64, out_size))


def banded_weights(n: int, out_size: int, src: int, seed: int, region: int | None = None) -> torch.Tensor:
    """Interpolation weights of random crops from the top-left `region` px of `src` px sources."""
    generator = torch.Generator().manual_seed(seed)
    region = region or src
    boxes = sample_crop_params(generator, torch.full((n,), region), torch.full((n,), region))
    scale = boxes.height.double() / out_size
    return axis_weights(boxes.top, boxes.height, scale, torch.zeros_like(boxes.top), out_size, src, antialias=True)


@pytest.mark.parametrize("extra", [1, 3])
def test_banded_product_equals_the_dense_one_and_reads_only_the_taps(extra):
    """Upscaling weights (crops of a 32 px corner of 128 px sources -> 299 px) summed over each row's
    taps: the dense product's values, and the rows below the corner are never read (inf there makes
    the dense product NaN through 0 * inf)."""
    weights = banded_weights(8, 299, 128, seed=1, region=32)
    data = torch.randn(8, extra, 128, 50, generator=torch.Generator().manual_seed(2))
    dense = torch.matmul(weights[:, None], data)
    banded = banded_matmul(weights, data)
    assert banded.shape == (8, extra, 299, 50) and banded.is_contiguous()
    torch.testing.assert_close(banded, dense, rtol=1e-5, atol=1e-5)
    data[:, :, 64:] = float("inf")
    assert torch.isfinite(banded_matmul(weights, data)).all()
    assert not torch.isfinite(torch.matmul(weights[:, None], data)).all()


def test_every_rows_taps_lie_in_its_window():
    weights = banded_weights(16, 299, 64, seed=4)  # tiny-imagenet's 64 px crops, upscaled
    start, span = row_taps(weights)
    assert start.shape == (16, 299) and span == 2  # bilinear upscaling: two taps per output row
    column = torch.arange(64)
    inside = (column >= start[:, :, None]) & (column < start[:, :, None] + span)
    assert not ((weights != 0) & ~inside).any()
    assert (start + span <= 64).all()


def test_a_wide_span_keeps_the_dense_product():
    """Shrinking whole 100 px images to 2 px: each row's taps span half the source or more."""
    whole = torch.zeros(4, dtype=torch.long)
    weights = axis_weights(whole, whole + 100, torch.full((4,), 50.0, dtype=torch.float64), whole, 2, 100, True)
    assert row_taps(weights) is None
    data = torch.randn(4, 2, 100, 7)
    assert torch.equal(banded_matmul(weights, data), torch.matmul(weights[:, None], data))
