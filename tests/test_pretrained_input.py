"""Google's Inception v3 / GoogLeNet weights expect pixels scaled to [-1, 1]. `transform_input=True`
converts ImageNet-normalised inputs to that; applied to a recipe's 0.5/0.5 normalisation (the demo's),
it fed the network about half the range the weights were trained on."""

from __future__ import annotations

import pytest
import torch
from conftest import make_image_folder

from inceptionlab.config import load_recipe
from inceptionlab.engine.session import build_training_session
from inceptionlab.models.spec import IMAGENET_MEAN, IMAGENET_STD


@pytest.mark.parametrize("mean,std", [((0.5,) * 3, (0.5,) * 3), (IMAGENET_MEAN, IMAGENET_STD)],
                         ids=["demo_half", "imagenet"])
def test_the_first_convolution_sees_what_the_weights_expect(inception_hub, tmp_path, mean, std):
    data = make_image_folder(tmp_path / "data", classes=("a", "b"), train_per_class=2, val_per_class=1, size=80)
    recipe = load_recipe("inception_v3/imagefolder", [
        f"data.root={data}", "model.weights=imagenet", "data.train_crop_size=75", "data.val_resize_size=75",
        "data.val_crop_size=75", f"data.mean={list(mean)}", f"data.std={list(std)}", "data.num_workers=0",
        "data.loader=workers", "train.batch_size=2", "train.precision=fp32", "train.compile=false",
        "train.channels_last=false"])
    session = build_training_session(recipe)
    seen = []
    hook = session.model.Conv2d_1a_3x3.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    pixels = torch.randint(0, 256, (2, 3, 75, 75), dtype=torch.uint8)
    session.model.eval()
    with torch.no_grad():
        session.model(session.settings.prepare(pixels))
    hook.remove()
    expected = (pixels.float() / 255 - 0.5) / 0.5  # what the weights were trained on
    assert torch.allclose(seen[0], expected, atol=1e-5)
    assert session.spec.arch_kwargs["transform_input"] == (mean == IMAGENET_MEAN)
