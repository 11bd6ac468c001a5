"""Grad-CAM (judge/explain.py): Captum's LayerGradCam against Grad-CAM by hand, the registry's target
layers, and `predict --explain`'s overlays."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.small_runs import small_run
from helpers.page_examples import check_example
from PIL import Image
from torch import nn

from inceptionlab.errors import UserError
from inceptionlab.models.spec import ModelSpec

pytest.importorskip("captum", reason="Captum is not installed (the trust extra)")

from inceptionlab.judge.explain import Explainer, OverlayNames, overlay  # noqa: E402


def _tiny_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 5, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(5, 3))


def _spec(size: int = 12, arch: str = "tiny") -> ModelSpec:
    return ModelSpec(arch=arch, num_classes=3, class_names=["a", "b", "c"], crop_size=size, resize_size=size,
                     mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25])


def _hand_gradcam(model: nn.Module, layer: nn.Module, pixels: torch.Tensor, classes: list[int]) -> torch.Tensor:
    """Selvaraju et al.'s Grad-CAM written out: ReLU(sum_k mean_ij(d y_c / d A_k) * A_k) at `layer`."""
    seen = {}
    handle = layer.register_forward_hook(lambda m, i, out: seen.setdefault("A", out))
    try:
        logits = model(pixels)
    finally:
        handle.remove()
    activations = seen["A"]
    score = logits[torch.arange(len(classes)), torch.tensor(classes)].sum()
    (gradients,) = torch.autograd.grad(score, activations)
    weights = gradients.mean(dim=(2, 3), keepdim=True)
    return torch.relu((weights * activations).sum(dim=1)).detach()


def test_gradcam_equals_gradcam_computed_by_hand():
    model, spec = _tiny_cnn(), _spec()
    batch = torch.randint(0, 256, (4, 3, 12, 12), dtype=torch.uint8)
    classes = [0, 2, 1, 2]
    explainer = Explainer(model, spec, torch.device("cpu"), layer="2")  # the second convolution
    expected = _hand_gradcam(model, model[2], spec.normalizer()(batch), classes)
    got = explainer.raw_maps(batch, classes)
    assert got.shape == (4, 12, 12) and expected.abs().sum() > 0
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-6)
    # Another class gives another map: the target reaches the gradient.
    assert not torch.allclose(explainer.raw_maps(batch, [1, 1, 1, 1]), got)


def test_maps_are_upsampled_to_the_input_and_scaled_to_one():
    model, spec = _tiny_cnn(), _spec()
    model[2].stride = (2, 2)  # a 6x6 map for a 12x12 input: the map must be upsampled
    explainer = Explainer(model, spec, torch.device("cpu"), layer="2")
    batch = torch.randint(0, 256, (3, 3, 12, 12), dtype=torch.uint8)
    raw = explainer.raw_maps(batch, [0, 1, 2])
    maps = explainer.maps(batch, [0, 1, 2])
    assert raw.shape == (3, 6, 6) and maps.shape == (3, 12, 12)
    up = nn.functional.interpolate(raw[:, None], size=(12, 12), mode="bilinear", align_corners=False)[:, 0]
    for got, want in zip(maps, up):
        if want.max() > 0:
            assert got.max() == pytest.approx(1.0) and torch.allclose(got, want / want.max(), atol=1e-6)
        else:
            assert torch.count_nonzero(got) == 0  # nothing pointed at the class: no heat, not NaN


@pytest.mark.parametrize("arch,size,layer", [
    ("inception_v3", 299, "Mixed_7c"),  # the layer: 8x8 at 299 px
    ("cifar10_cnn", 32, "4"),
    ("resnet18", 64, "layer4"),
    ("mobilenet_v3_small", 64, "features"),
    ("squeezenet1_0", 64, "features"),  # the last spatial module is its classifier's conv: the table decides
    ("swin_t", 64, "permute"),  # not in the table: the last spatial NCHW map, found by one forward pass
])
def test_each_registry_model_is_explained_at_its_layer(arch, size, layer):
    from inceptionlab.models.registry import build_model, cam_layer

    model = build_model(arch, 3, None).model.eval()
    spec = _spec(size, arch)
    assert cam_layer(arch, model, spec.input_shape) == layer
    explainer = Explainer(model, spec, torch.device("cpu"))
    batch = torch.randint(0, 256, (1, 3, size, size), dtype=torch.uint8)
    assert explainer.layer == layer
    cams = explainer.maps(batch, [1])
    assert cams.shape == (1, size, size) and torch.isfinite(cams).all() and 0 <= cams.min() <= cams.max() <= 1


@pytest.mark.parametrize("arch", ["fashion_mlp", "vit_b_16", "text_classifier"])
def test_a_model_without_a_spatial_map_is_refused_with_the_reason(arch):
    from inceptionlab.models.registry import cam_layer

    with pytest.raises(UserError, match=f"{arch}: no Grad-CAM: "):
        cam_layer(arch, nn.Identity(), (1, 28, 28))


def test_a_text_spec_is_refused():
    spec = ModelSpec(arch="text_classifier", num_classes=2, class_names=["neg", "pos"], input_kind="tokens",
                     sequence_length=8)
    with pytest.raises(UserError, match="classifies tokens, not images"):
        Explainer(nn.Linear(8, 1), spec, torch.device("cpu"))


def test_overlay_names_never_repeat():
    names = OverlayNames()
    assert [names(Path(p)) for p in ("a/x.jpg", "b/x.png", "y.png", "c/x.jpg")] == [
        "x.cam.png", "x-2.cam.png", "y.cam.png", "x-3.cam.png"]


def test_an_overlay_is_the_image_tinted_by_the_map_and_small_inputs_are_enlarged():
    image = torch.full((1, 28, 28), 128, dtype=torch.uint8)  # grey, one channel (Fashion-MNIST's)
    cam = torch.zeros(28, 28)
    cam[:14] = 1.0  # hot top half, cold bottom half
    picture = np.asarray(overlay(image, cam))
    assert picture.shape == (140, 140, 3)  # 28 px x 5 >= 128
    top, bottom = picture[:70].reshape(-1, 3).mean(0), picture[70:].reshape(-1, 3).mean(0)
    assert top[0] > top[2] and bottom[2] > bottom[0]  # jet: red where hot, blue where cold


def test_predict_explain_writes_an_overlay_per_image(tmp_path_factory, tmp_path, cli):
    run = small_run(tmp_path_factory)
    images = sorted((run.data / "val" / "fox").glob("*.png"))[:3]
    result = cli("predict", *images, "--run", run.run_dir, "--explain", tmp_path / "cams", "--json", "--batch-size", "2")
    assert result.code == 0, result.err
    rows = [json.loads(line) for line in result.out.splitlines()]
    assert [Path(r["file"]).name for r in rows] == [p.name for p in images]
    check_example("errors-explain-json", result.out.splitlines()[0])
    for row, image in zip(rows, images):
        written = Path(row["explain"])
        assert written == tmp_path / "cams" / f"{image.stem}.cam.png"
        picture = Image.open(written)
        assert picture.format == "PNG" and picture.size == (128, 128)  # 32 px input x 4
    text = cli("predict", images[0], "--run", run.run_dir, "--explain", tmp_path / "more")
    assert text.code == 0 and f"Grad-CAM: {tmp_path / 'more' / images[0].stem}.cam.png" in text.out


def test_predict_explain_refuses_text(cli, tmp_path):
    result = cli("predict", "--text", "fine", "--explain", tmp_path / "cams")
    assert result.code != 0 and "a text model has none to draw on" in result.err and not (tmp_path / "cams").exists()
