"""`data.loader=stream`: batches decoded in workers equal the resident loader's, resume, skip, auto choice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from conftest import ONE_THREAD

from inceptionlab.data.datasets.imagefolder import RobustImageFolder
from inceptionlab.data.loading import resident
from inceptionlab.data.loading.decoded_cache import decode_to_fit
from inceptionlab.data.loading.image_options import DeviceImageOptions
from inceptionlab.data.loading.loaders import Loader, make_loader
from inceptionlab.data.loading.resident import ResidentImageLoader, ResidentLoader
from inceptionlab.data.loading.streamed import PadBatch, StreamImageLoader
from inceptionlab.data.loading.workers import SkipTrackingLoader
from inceptionlab.data.splits import ArraySplit

CACHE = 48  # the shorter side kept: the big JPEG below is shrunk to it, the PNGs stay exact
# (height, width) per image: 7 per class, 2 classes, portraits among them (stored turned on their side):
# the resident cache pads to (48, 64) (the big JPEG's stored sides), the stream loader each batch to its own.
SIZES = [(20, 20), (24, 16), (13, 30), (40, 40), (31, 22), (17, 17), (36, 12)]
BIG = (160, 120)  # JPEG, larger than CACHE: PIL draft decodes it at 1/2 scale (80 x 60), then it shrinks to 64 x 48


def make_mixed_folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for c, name in enumerate(("ant", "bee")):
        folder = root / name
        folder.mkdir(parents=True)
        for i, (h, w) in enumerate(SIZES):
            pixels = np.clip(rng.integers(-60, 60, (h, w, 3)) + 100 + 60 * c, 0, 255).astype("uint8")
            Image.fromarray(pixels).save(folder / f"{name}_{i}.png")
    big = rng.integers(0, 255, (*BIG, 3)).astype("uint8")
    Image.fromarray(big).save(root / "ant" / "big.jpg", quality=90)
    return root


@pytest.fixture
def folder(tmp_path) -> Path:
    return make_mixed_folder(tmp_path / "train")


def options(**overrides) -> DeviceImageOptions:
    return DeviceImageOptions(**{"train_size": 32, "val_resize_size": 32, "val_crop_size": 28, "cache_size": CACHE,
                                   **overrides})


def loaders(folder: Path, train: bool, workers: int = 0, **overrides):
    split = RobustImageFolder(folder)
    common = dict(batch_size=4, train=train, seed=3, num_workers=workers, images=options(**overrides))
    return make_loader(split, mode="resident", **common), make_loader(split, mode="stream", **common)


def epoch(loader, number: int, start: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader.set_epoch(number, start)
    return list(loader)


def assert_same_batches(a, b) -> None:
    assert len(a) == len(b)
    for (x, y), (u, v) in zip(a, b):
        assert x.dtype == u.dtype and torch.equal(x, u) and torch.equal(y, v)


def test_decode_to_fit_shrinks_a_large_jpeg_keeping_its_aspect(folder):
    image = decode_to_fit(str(folder / "ant" / "big.jpg"), CACHE)
    assert image.dtype == torch.uint8 and tuple(image.shape) == (3, 64, 48)  # upright, the shorter side at 48
    small = decode_to_fit(str(folder / "ant" / "ant_2.png"), CACHE)
    assert tuple(small.shape) == (3, 13, 30)  # fits already: decoded exactly
    broken = folder / "bee" / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    unreadable = decode_to_fit(str(broken), CACHE)
    assert unreadable == str(broken) and unreadable.problem.startswith("image data is truncated or corrupt")


@pytest.mark.parametrize("train", [True, False], ids=["train_hflip", "eval"])
def test_stream_batches_equal_resident_batches(folder, train):
    resident, stream = loaders(folder, train, hflip=True)
    assert isinstance(resident, ResidentImageLoader) and isinstance(stream, StreamImageLoader)
    assert resident.images.shape[-2:] == (48, 64)  # the padding differs from the stream loader's batches'
    assert len(stream) == len(resident) == (3 if train else 4)  # 15 images: training drops the partial batch
    for number in (0, 1):
        assert_same_batches(epoch(resident, number), epoch(stream, number))
    assert stream.yields_normalised and stream.skipped == []


def test_two_workers_give_the_same_batches(folder):
    resident, stream = loaders(folder, train=True, workers=2, hflip=True)
    assert stream.loader.num_workers == 2 and stream.loader.persistent_workers
    assert_same_batches(epoch(resident, 1), epoch(stream, 1))
    assert_same_batches(epoch(resident, 2), epoch(stream, 2))  # persistent workers, the next epoch's order


def test_mid_epoch_start_yields_the_rest_of_the_epoch(folder):
    _, stream = loaders(folder, train=True, hflip=True)
    full = epoch(stream, 2)
    tail = epoch(stream, 2, start=8)
    assert len(full) == 3 and len(tail) == 1  # 15 images: 3 full training batches
    assert_same_batches(full[2:], tail)
    assert not torch.equal(epoch(stream, 3)[0][0], full[0][0])  # another epoch: other order and boxes


def test_unreadable_files_are_named_and_left_out(folder):
    broken = folder / "bee" / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    _, stream = loaders(folder, train=True)
    batches = epoch(stream, 0)
    assert stream.skipped == [str(broken)]
    assert sum(len(t) for _, t in batches) == 15  # 16 files, the broken one left out
    assert all(torch.isfinite(x).all() for x, _ in batches)


def test_every_collated_batch_is_uint8_padded_to_its_own_images(folder):
    _, stream = loaders(folder, train=False)
    stream.set_epoch(0)
    collated = list(stream.loader)  # what the workers hand over, before the copy to the device
    assert [len(targets) for _, _, _, targets, _ in collated] == [4, 4, 4, 3]
    for pixels, heights, widths, targets, skipped in collated:
        assert pixels.dtype == torch.uint8 and pixels.shape[:2] == (4, 3) and skipped == []
        assert len(heights) == len(widths) == len(targets)
        shorts, longs = torch.minimum(heights, widths), torch.maximum(heights, widths)
        assert pixels.shape[2:] == (int(shorts.max()), int(longs.max()))  # portraits turned on their side
        for n in range(len(targets)):
            assert pixels[n, :, shorts[n]:].sum() == 0 and pixels[n, :, :, longs[n]:].sum() == 0
    sizes = {(int(h), int(w)) for _, heights, widths, _, _ in collated for h, w in zip(heights, widths)}
    assert sizes == {*SIZES, (64, 48)}
    assert collated[-1][0][3:].sum() == 0  # the short last batch: its padding row is all zeros


def test_pad_batch_places_images_top_left_turns_portraits_and_skips_unreadable():
    landscape = torch.full((3, 2, 5), 7, dtype=torch.uint8)
    portrait = torch.arange(3 * 4 * 3, dtype=torch.uint8).view(3, 4, 3)
    pixels, heights, widths, targets, skipped = PadBatch(3)([(landscape, 1), (None, "gone.jpg"), (portrait, 0)])
    assert pixels.shape == (3, 3, 3, 5) and pixels[0, :, :2, :5].eq(7).all() and pixels[0].sum() == 7 * 30
    assert torch.equal(pixels[1, :, :3, :4], portrait.transpose(1, 2)) and pixels[2].sum() == 0
    assert heights.tolist() == [2, 4] and widths.tolist() == [5, 3] and targets.tolist() == [1, 0]
    assert skipped == ["gone.jpg"]


def test_auto_streams_image_folders_that_do_not_fit(folder, monkeypatch):
    split = RobustImageFolder(folder)
    common = dict(batch_size=4, train=True, seed=0, num_workers=0, images=options())
    assert isinstance(make_loader(split, mode="auto", **common), ResidentImageLoader)
    assert isinstance(make_loader(split, mode="stream", **common), StreamImageLoader)
    assert type(make_loader(split, mode="workers", **common)) is SkipTrackingLoader
    monkeypatch.setattr(resident, "available_host_bytes", lambda: 0)  # nothing fits on the host (CPU device)
    assert isinstance(make_loader(split, mode="auto", **common), StreamImageLoader)
    assert isinstance(make_loader(split, mode="resident", **common), ResidentImageLoader)  # asked for: no size check
    arrays = ArraySplit(torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.zeros(4, dtype=torch.long), ["x"])
    assert isinstance(make_loader(arrays, mode="auto", **common), ResidentLoader)  # arrays are not image folders
    assert type(make_loader(arrays, mode="stream", **common)) is SkipTrackingLoader



def test_every_loader_says_whether_its_batches_arrive_normalised(folder):
    """The session asks `yields_normalised` of whatever `make_loader` returns (the `Loader` protocol)."""
    split = RobustImageFolder(folder)
    arrays = ArraySplit(torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.zeros(4, dtype=torch.long), ["x"])
    common = dict(batch_size=4, train=True, seed=0, num_workers=0)
    built = {"resident images": make_loader(split, mode="resident", images=options(), **common),
             "streamed images": make_loader(split, mode="stream", images=options(), **common),
             "workers": make_loader(arrays, mode="workers", **common),
             "resident arrays": make_loader(arrays, mode="auto", **common)}
    assert all(isinstance(loader, Loader) for loader in built.values())
    normalised = {name: loader.yields_normalised for name, loader in built.items()}
    assert normalised == {"resident images": True, "streamed images": True, "workers": False, "resident arrays": False}
    images, _ = next(iter(built["resident images"]))
    pixels, _ = next(iter(built["workers"]))
    assert images.dtype == torch.float32 and pixels.dtype == torch.uint8  # what the flag promises

def test_training_with_stream_ends_with_the_resident_runs_weights(tmp_path):
    from conftest import make_image_folder
    from test_engine import SMALL_CNN, recipe_for, state_of

    from inceptionlab.engine.fit import fit

    data = make_image_folder(tmp_path / "data", train_per_class=3, val_per_class=2, size=24)
    runs = {}
    for loader in ("resident", "stream"):
        recipe = recipe_for(data, *SMALL_CNN, f"data.loader={loader}", "data.hflip=true", "train.epochs=2", ONE_THREAD)
        outcome = fit(recipe, tmp_path / loader, progress=False)
        assert outcome.status == "completed"
        runs[loader] = state_of(outcome.run_dir / "model.pt")
    assert all(torch.equal(runs["resident"][key], runs["stream"][key]) for key in runs["resident"])
