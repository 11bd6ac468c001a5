"""ModelSpec owns preprocessing; empty recipe fields take the model's own preprocessing (timm's resolve_data_config)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from inceptionlab.config import load_recipe
from inceptionlab.errors import UserError
from inceptionlab.models.registry import (
    pretrained_spec,
    resolve_data_config,
    weights_preprocessing,
)
from inceptionlab.models.spec import ModelSpec

IMAGENET_MEAN = [0.485, 0.456, 0.406]
EMPTY = ["data.train_crop_size=null", "data.val_resize_size=null", "data.val_crop_size=null",
         "data.interpolation=null", "data.mean=null", "data.std=null"]


def resolved(recipe: str, *overrides: str):
    loaded = load_recipe(recipe, list(overrides))
    return resolve_data_config(loaded.data, loaded.model.name)


@pytest.mark.parametrize("model, resize, crop", [("resnet50", 232, 224), ("inception_v3", 342, 299)])
def test_empty_fields_come_from_the_weights_metadata(model, resize, crop):
    data = resolved("inception_v3/imagefolder", f"model.name={model}")
    assert (data.val_resize_size, data.val_crop_size, data.train_crop_size) == (resize, crop, crop)
    assert data.interpolation == "bilinear" and data.mean == IMAGENET_MEAN and data.std == [0.229, 0.224, 0.225]


def test_weights_metadata_is_read_from_the_enum_not_a_file(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "empty-hub"))  # nothing cached, no network
    assert weights_preprocessing("efficientnet_b0").interpolation == "bicubic"  # 256 -> 224 bicubic
    assert (pretrained_spec("resnet50").resize_size, pretrained_spec("resnet50").crop_size) == (232, 224)


def test_explicit_fields_win_and_the_guides_recipe_keeps_342_299():
    guide = resolved("inception_v3/tiny_imagenet", "model.name=resnet50")
    assert (guide.val_resize_size, guide.val_crop_size, guide.train_crop_size) == (342, 299, 299)
    mixed = resolved("inception_v3/imagefolder", "model.name=resnet50", "data.val_crop_size=200")
    assert (mixed.val_resize_size, mixed.val_crop_size, mixed.train_crop_size) == (232, 200, 200)


def test_small_models_use_the_registrys_declared_defaults():
    fashion = resolved("fashion_mnist/mlp", *EMPTY)
    assert (fashion.val_resize_size, fashion.val_crop_size, fashion.mean, fashion.std) == (28, 28, [0.0], [1.0])
    cifar = resolved("cifar10/small_cnn", *EMPTY)
    assert (cifar.val_crop_size, cifar.mean) == (32, [0.5, 0.5, 0.5])
    text = resolved("imdb/text_classifier")
    assert text.val_crop_size is None and text.mean is None  # token ids: no image preprocessing to fill


def test_filled_fields_that_contradict_are_a_one_line_error():
    with pytest.raises(UserError, match=r"val_resize_size=232 is smaller than data.val_crop_size=300.*resnet50"):
        resolved("inception_v3/imagefolder", "model.name=resnet50", "data.val_crop_size=300")


def photo(width=60, height=40) -> Image.Image:
    pixels = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def test_preprocess_gives_the_specs_shape_and_channels():
    grey = ModelSpec("fashion_mlp", 2, ["a", "b"], crop_size=28, resize_size=28, channels=1, mean=[0.0], std=[1.0])
    out = grey.preprocess(photo())
    assert out.dtype == torch.uint8 and tuple(out.shape) == grey.input_shape == (1, 28, 28)
    # The grey channel is the photo's luma (ITU-R 601, as PIL's convert("L")) within one level of rounding.
    from_luma = grey.preprocess(photo().convert("L"))
    assert (out.int() - from_luma.int()).abs().max() <= 1

    rgb = ModelSpec("cifar10_cnn", 2, ["a", "b"], crop_size=32, resize_size=36)
    out = rgb.preprocess(photo().convert("L"))  # a grey picture for an RGB model: replicated to 3 channels
    assert tuple(out.shape) == rgb.input_shape == (3, 32, 32)
    assert torch.equal(out[0], out[1]) and torch.equal(out[1], out[2])


def test_normalizer_maps_uint8_to_normalised_floats_in_the_chosen_layout():
    spec = ModelSpec("cifar10_cnn", 2, ["a", "b"], mean=[0.5, 0.25, 0.0], std=[0.5, 0.25, 1.0])
    batch = torch.full((2, 3, 4, 4), 255, dtype=torch.uint8)
    out = spec.normalizer(channels_last=True)(batch)
    assert out.dtype == torch.float32 and out.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(out[0, :, 0, 0], torch.tensor([1.0, 3.0, 1.0]))


def test_a_text_spec_has_a_token_shape_and_no_image_preprocessing():
    spec = ModelSpec("text_classifier", 2, ["neg", "pos"], input_kind="tokens", sequence_length=250)
    assert spec.input_shape == (250,)
    with pytest.raises(UserError, match="takes tokens, not images"):
        spec.preprocess(photo())
    with pytest.raises(UserError, match="takes tokens, not images"):
        spec.normalizer()
