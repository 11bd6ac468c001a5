"""One preprocessing path (ModelSpec) for every command, and sample pictures that travel with the package."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

import inceptionlab
from inceptionlab.data.io.image_files import SAMPLE_IMAGES_ENV, sample_image_files
from inceptionlab.infer.inputs import default_image_files, load_images, normalize
from inceptionlab.infer.predict import Predictor
from inceptionlab.loadtest.payloads import image_files as loadtest_image_files
from inceptionlab.models.spec import ModelSpec

BUNDLED = Path(inceptionlab.__file__).resolve().parent / "resources" / "sample_images"


class Recorder(nn.Module):
    """Stands in for a model: keeps the batch it was given, answers zero logits."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.num_classes, self.seen = num_classes, []

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        self.seen.append(images.clone())
        return torch.zeros(len(images), self.num_classes)


@pytest.fixture()
def colour_noise(tmp_path) -> Path:
    """An RGB picture whose grey conversion differs between PIL's and torchvision's luma rounding."""
    pixels = np.random.default_rng(0).integers(0, 256, size=(40, 52, 3), dtype=np.uint8)
    path = tmp_path / "noise.png"
    Image.fromarray(pixels).save(path)
    return path


def test_a_grey_model_gets_the_same_input_from_export_serve_and_predict(colour_noise):
    pytest.importorskip("fastapi")
    from inceptionlab.serve.models import ServedModel

    spec = ModelSpec("mlp", 2, ["a", "b"], channels=1, resize_size=28, crop_size=28, mean=[0.5], std=[0.5])
    exported = torch.from_numpy(normalize(load_images([colour_noise], spec), spec))  # export, quantize, bench
    served = ServedModel("m", spec, "test", "eager", "fp32", "cpu", [], 1)
    pixels = served.preprocess_image(colour_noise.read_bytes(), colour_noise.name)
    from_serve = served.normalize(torch.from_numpy(pixels[None]))
    recorder = Recorder(2)
    [result] = Predictor(recorder, spec, torch.device("cpu")).predict_files([colour_noise])
    assert "topk" in result
    [from_predict] = recorder.seen
    assert exported.shape == (1, 1, 28, 28)
    assert torch.equal(exported, from_serve) and torch.equal(exported, from_predict)
    # and all of them are the spec's own transform of the decoded picture, nothing before it
    direct = spec.normalizer()(spec.preprocess(Image.open(colour_noise).convert("RGB"))[None])
    assert torch.equal(exported, direct)


def test_sample_pictures_come_from_the_package_whatever_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.delenv(SAMPLE_IMAGES_ENV, raising=False)
    monkeypatch.chdir(tmp_path)  # neither the repository nor its parent
    bundled = sorted(BUNDLED.glob("*.jpg"))
    assert len(bundled) >= 2
    assert sample_image_files() == bundled
    assert loadtest_image_files([]) == bundled  # the load generator's default pictures
    assert default_image_files(SimpleNamespace(run_dir=None)) == bundled  # export's parity, int8 calibration


def test_the_environment_variable_names_other_sample_pictures(tmp_path, monkeypatch):
    own = tmp_path / "mine"
    own.mkdir()
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 200, 30)).save(buffer, format="PNG")
    (own / "one.png").write_bytes(buffer.getvalue())
    monkeypatch.setenv(SAMPLE_IMAGES_ENV, str(own))
    assert sample_image_files() == loadtest_image_files([]) == [own / "one.png"]
    monkeypatch.setenv(SAMPLE_IMAGES_ENV, str(tmp_path / "absent"))
    assert sample_image_files() == []  # named but missing: no pictures, never the bundled ones
