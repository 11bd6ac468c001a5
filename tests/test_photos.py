"""Your own photos: larger than the cache and not square. Training's validation scores the pixels
`evaluate` scores, on every loader; the cache keeps the shorter side; the recipe's interpolation is
the one the device resamples with."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import shared_data
from PIL import Image
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as F

from inceptionlab.config import load_recipe
from inceptionlab.data.io.decode import load_rgb
from inceptionlab.data.datasets.imagefolder import RobustImageFolder
from inceptionlab.data.loading import decoded_cache
from inceptionlab.data.loading.image_options import DeviceImageOptions
from inceptionlab.data.loading.loaders import make_loader
from inceptionlab.data.transforms.device import Boxes, resample
from inceptionlab.engine.fit import fit
from inceptionlab.judge.evaluate import evaluate_run
from inceptionlab.models.registry import resolve_data_config
from inceptionlab.models.spec import eval_transform

# A photo as a phone takes it, in both orientations (500 x 375 and 375 x 500, width x height).
LANDSCAPE, PORTRAIT = (375, 500), (500, 375)  # (height, width)
# resnet18 at 112 px keeps the test short; the cache is exactly the eval resize, as by default.
RESIZE, CROP = 128, 112
PHOTO_RECIPE = ["model.name=resnet18", "model.weights=null", "finetune.body_lr_mult=1", f"data.train_crop_size={CROP}",
                f"data.val_resize_size={RESIZE}", f"data.val_crop_size={CROP}", f"data.cache_size={RESIZE}",
                "data.num_workers=0", "data.hflip=true", "train.batch_size=4", "train.epochs=1", "train.log_every=1",
                "optim.lr=0.01", "train.precision=fp32", "train.channels_last=false", "train.compile=false"]


def photo(size: tuple[int, int], tint: int, seed: int) -> Image.Image:
    """Smooth shapes plus fine texture: a resampling that blurs changes the model's input visibly."""
    rng = np.random.default_rng(seed)
    height, width = size
    y, x = np.mgrid[0:height, 0:width]
    base = 128 + 60 * np.sin(x / (7 + seed % 5)) * np.cos(y / 11) + rng.normal(0, 25, (height, width))
    pixels = np.stack([base + tint, base, base - tint], axis=-1)
    return Image.fromarray(np.clip(pixels, 0, 255).astype("uint8"))


def make_photo_folder(root: Path, per_class: dict[str, int]) -> Path:
    for split, count in per_class.items():
        for c, name in enumerate(("beach", "forest")):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                size = LANDSCAPE if i % 2 == 0 else PORTRAIT
                photo(size, 40 if c else -40, seed=100 * c + i + (1000 if split == "val" else 0)).save(
                    folder / f"{name}_{i}.jpg", quality=92)
    return root


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    return make_photo_folder(tmp_path_factory.mktemp("photos"), {"train": 4, "val": 3})


@pytest.mark.parametrize("loader", ["resident", "stream", "workers"])
def test_validation_during_training_equals_evaluate_on_photos_larger_than_the_cache(photos, tmp_path, loader):
    """The last epoch's val_loss/val_top1 are `evaluate`'s on the same weights and split. The cache once
    fitted the longer side to data.cache_size (500 x 375 -> 128 x 96), and validation upsampled 96 -> 128."""
    recipe = load_recipe("inception_v3/imagefolder", [*PHOTO_RECIPE, f"data.root={photos}", f"data.loader={loader}"])
    outcome = fit(recipe, tmp_path / "runs", progress=False)
    row = json.loads((outcome.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    scored = evaluate_run(outcome.run_dir, None, None, device=torch.device("cpu"), batch_size=5, num_workers=0)
    assert row["val_samples"] == scored.result["samples"] == 6
    assert row["val_loss"] == pytest.approx(scored.result["loss"], rel=1e-5, abs=1e-6)
    assert row["val_top1"] == pytest.approx(scored.result["top1"])


def test_the_cache_keeps_the_shorter_side_at_the_cache_size(tmp_path):
    root = make_photo_folder(tmp_path, {"train": 2})
    landscape, portrait = root / "train" / "beach" / "beach_0.jpg", root / "train" / "beach" / "beach_1.jpg"
    assert tuple(decoded_cache.decode_to_fit(str(landscape), 342).shape) == (3, 342, 456)
    assert tuple(decoded_cache.decode_to_fit(str(portrait), 342).shape) == (3, 456, 342)
    small = tmp_path / "small.png"
    Image.new("RGB", (300, 200), (10, 20, 30)).save(small)
    assert tuple(decoded_cache.decode_to_fit(str(small), 342).shape) == (3, 200, 300)  # kept exactly


def test_a_mixed_orientation_folder_is_cached_without_square_padding(tmp_path):
    """Portrait photos are stored turned on their side: 342 x 456 per 4:3 photo, not 456 x 456."""
    root = make_photo_folder(tmp_path, {"train": 2})
    folder = RobustImageFolder(root / "train")
    cache = decoded_cache.decode_split(folder.samples, 342)
    assert tuple(cache.images.shape) == (4, 3, 342, 456)
    assert cache.heights.tolist() == [342, 456, 342, 456]  # upright sizes
    assert cache.widths.tolist() == [456, 342, 456, 342]
    assert decoded_cache.estimated_bytes(folder.samples, root / "train", 342) == 4 * 3 * 342 * 456


def test_resident_and_stream_batches_put_portraits_upright(tmp_path):
    """The eval batch of a cached portrait photo equals the same photo's eval transform from the file."""
    root = make_photo_folder(tmp_path, {"train": 2})
    split = RobustImageFolder(root / "train")
    options = DeviceImageOptions(train_size=CROP, val_resize_size=RESIZE, val_crop_size=CROP, cache_size=RESIZE)
    mean = torch.tensor(options.mean).view(-1, 1, 1) * 255
    std = torch.tensor(options.std).view(-1, 1, 1) * 255
    evaluates = eval_transform(RESIZE, CROP, "bilinear")  # what `evaluate` does to a file
    expected = [(evaluates(load_rgb(path, max_side=RESIZE)).float() - mean) / std for path, _ in split.samples]
    for mode in ("resident", "stream"):
        loader = make_loader(split, batch_size=4, train=False, seed=0, num_workers=0, mode=mode, images=options)
        loader.set_epoch(0)
        (batch, _), = list(loader)
        for n, want in enumerate(expected):
            assert torch.allclose(batch[n], want, atol=1e-5), (mode, n)


@pytest.mark.parametrize("mode,reference", [("bicubic", InterpolationMode.BICUBIC),
                                            ("nearest", InterpolationMode.NEAREST)])
def test_the_device_resampler_honours_the_interpolation(mode, reference):
    """As torchvision resizes tensors (the worker path's transforms, `evaluate`'s): bicubic is its
    antialiased bicubic (a = -0.5), nearest torch's nearest (source pixel floor(k x scale))."""
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (3, 3, 60, 50), generator=generator, dtype=torch.uint8)
    boxes = Boxes(torch.tensor([0, 5, 10]), torch.tensor([0, 3, 7]), torch.tensor([60, 30, 44]),
                  torch.tensor([50, 41, 20]))
    for out_size in (24, 80):  # downscaling (the filter widens) and upscaling
        ours = resample(images.float(), boxes, out_size, interpolation=mode, channels_last=False)
        for n in range(3):
            crop = images[n : n + 1, :, boxes.top[n] : boxes.top[n] + boxes.height[n],
                          boxes.left[n] : boxes.left[n] + boxes.width[n]].float()
            theirs = F.resize(crop, [out_size, out_size], interpolation=reference, antialias=True)
            assert torch.allclose(ours[n], theirs[0], atol=1e-3), (mode, out_size, n)


def test_the_cache_size_follows_the_model_and_a_smaller_one_is_said():
    recipe = load_recipe("inception_v3/imagefolder", ["data.root=x"])
    assert recipe.data.cache_size is None
    assert resolve_data_config(recipe.data, "inception_v3").cache_size == 342  # Inception v3's eval resize
    assert resolve_data_config(recipe.data, "resnet50").cache_size == 232  # ResNet50's
    from inceptionlab.engine.notes import cache_size_notes

    small = resolve_data_config(load_recipe("inception_v3/imagefolder", ["data.root=x", "data.cache_size=256"]).data,
                                "inception_v3")
    (note,) = cache_size_notes(small)
    assert "data.cache_size=256" in note and "342" in note
    assert cache_size_notes(resolve_data_config(recipe.data, "inception_v3")) == []


def test_validation_equals_evaluate_on_real_photos(tmp_path):
    """The same on the real photographs in ../shared/data (480 x 360 up to 1546 x 1213, one portrait)."""
    images = sorted((shared_data("imagenet-sample") / "images").glob("*.jpg"))
    for split in ("train", "val"):
        for n, path in enumerate(images):
            folder = tmp_path / "data" / split / ("animal" if n % 2 == 0 else "scene")
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, folder / path.name)
    recipe = load_recipe("inception_v3/imagefolder", [*PHOTO_RECIPE, f"data.root={tmp_path / 'data'}",
                                                      "data.loader=resident", "train.batch_size=2"])
    outcome = fit(recipe, tmp_path / "runs", progress=False)
    row = json.loads((outcome.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    scored = evaluate_run(outcome.run_dir, None, None, device=torch.device("cpu"), batch_size=3, num_workers=0)
    assert row["val_samples"] == scored.result["samples"] == len(images)
    assert row["val_loss"] == pytest.approx(scored.result["loss"], rel=1e-5, abs=1e-6)


def test_the_banded_width_product_equals_the_dense_one():
    """Sources wider than the output (photos) skip the width product's zeros on a CPU: same values."""
    from inceptionlab.data.transforms.device import _operand, _widths_first, axis_weights

    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (3, 3, 20, 90), generator=generator, dtype=torch.uint8)
    start, width = torch.tensor([0, 10, 30]), torch.tensor([90, 61, 40])
    cols = axis_weights(start, width, width.double() / 32, torch.zeros(3, dtype=torch.long), 32, 90, True, "bicubic")
    dense = _widths_first(_operand(images, torch.float32, None, False), cols, 32, banded=False)
    banded = _widths_first(_operand(images, torch.float32, None, True), cols, 32, banded=True)
    assert banded.shape == dense.shape == (3, 3, 20, 32)
    assert torch.allclose(banded, dense, atol=1e-4)
