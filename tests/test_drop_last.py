"""Training drops the last partial batch on every loader (as timm does); validation keeps every sample.

A last training batch of one image made BatchNorm raise `Expected more than 1 value per channel when
training` after the epoch's work, before its checkpoint (Inception v3's aux head, 33 images at batch 32).
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_image_folder

from inceptionlab.config import load_recipe
from inceptionlab.data.datasets.imagefolder import RobustImageFolder
from inceptionlab.data.loading.image_options import DeviceImageOptions
from inceptionlab.data.loading.loaders import make_loader
from inceptionlab.data.splits import ArraySplit
from inceptionlab.engine.fit import fit
from inceptionlab.engine.session import build_training_session
from inceptionlab.models.spec import eval_transform

# resnet18 at 32 px: layer4's map is 1 x 1, so a batch of one image has one value per BatchNorm channel.
BN_RECIPE = ["model.name=resnet18", "model.weights=null", "finetune.body_lr_mult=1", "data.train_crop_size=32", "data.val_resize_size=32",
             "data.val_crop_size=32", "data.num_workers=0", "train.batch_size=4", "train.epochs=1",
             "train.log_every=1", "optim.lr=0.01"]


@pytest.mark.parametrize("loader", ["resident", "stream", "workers"])
def test_a_last_batch_of_one_image_does_not_reach_batchnorm(tmp_path, loader):
    data = make_image_folder(tmp_path / "data", classes=("cat", "dog", "fox"), train_per_class=3, val_per_class=1,
                             size=36)  # 9 training images at batch 4: 4 + 4 + 1
    recipe = load_recipe("inception_v3/imagefolder", [*BN_RECIPE, f"data.root={data}", f"data.loader={loader}"])
    outcome = fit(recipe, tmp_path / "runs", progress=False)
    row = json.loads((outcome.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert outcome.status == "completed"
    assert row["samples"] == 8  # two full batches; the ninth image waits for another epoch's order
    assert row["val_samples"] == 3  # validation keeps every image


def image_split(tmp_path, train_per_class):
    """12 px images; the transform (8 px crops, the worker path's) is what `data.loader=workers` runs."""
    data = make_image_folder(tmp_path / "d", classes=("a", "b", "c"), train_per_class=train_per_class,
                             val_per_class=1, size=12)
    return RobustImageFolder(data / "train", transform=eval_transform(8, 8, "bilinear"))


ARRAYS = ArraySplit(torch.zeros(11, 1, 4, 4, dtype=torch.uint8), torch.arange(11) % 2, ["x", "y"])


@pytest.mark.parametrize("mode", ["resident", "stream", "workers", "arrays_resident", "arrays_workers"])
@pytest.mark.parametrize("world_size", [1, 2])
def test_every_training_batch_is_full_and_every_rank_takes_the_same_steps(tmp_path, mode, world_size):
    arrays = mode.startswith("arrays")
    split = ARRAYS if arrays else image_split(tmp_path, 4)  # 11 or 12 images
    options = None if arrays else DeviceImageOptions(train_size=8, val_resize_size=8, val_crop_size=8, cache_size=12)
    lengths = []
    for rank in range(world_size):
        loader = make_loader(split, batch_size=4, train=True, seed=0, num_workers=0, rank=rank,
                             world_size=world_size, mode=mode.removeprefix("arrays_"), images=options)
        loader.set_epoch(1)
        sizes = [len(targets) for _, targets in loader]
        assert sizes and all(size == 4 for size in sizes), sizes
        assert len(loader) == len(sizes)
        lengths.append(len(sizes))
        evaluation = make_loader(split, batch_size=4, train=False, seed=0, num_workers=0, rank=rank,
                                 world_size=world_size, mode=mode.removeprefix("arrays_"), images=options)
        evaluation.set_epoch(0)
        assert sum(len(targets) for _, targets in evaluation) == len(range(rank, len(split), world_size))
    assert len(set(lengths)) == 1
    assert lengths[0] == (len(split) // world_size + (len(split) % world_size > 0)) // 4


def test_a_training_split_smaller_than_one_batch_trains_on_one_smaller_batch(tmp_path):
    data = make_image_folder(tmp_path / "data", classes=("a", "b"), train_per_class=3, val_per_class=1, size=36)
    recipe = load_recipe("inception_v3/imagefolder", [*BN_RECIPE, f"data.root={data}", "train.batch_size=32"])
    session = build_training_session(recipe)
    assert session.recipe.train.batch_size == 6  # recipe.resolved.yaml says what ran
    assert any("6 training images" in note and "train.batch_size=32" in note for note in session.notes)
    session.train_loader.set_epoch(0)
    assert [len(targets) for _, targets in session.train_loader] == [6]


def test_a_training_split_of_one_image_is_a_clear_error(tmp_path):
    from inceptionlab.errors import UserError

    data = make_image_folder(tmp_path / "data", classes=("a", "b"), train_per_class=1, val_per_class=1, size=36)
    recipe = load_recipe("inception_v3/imagefolder", [*BN_RECIPE, f"data.root={data}", "data.max_train_samples=1"])
    with pytest.raises(UserError, match="1 training image per process"):
        build_training_session(recipe)
