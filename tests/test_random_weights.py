"""`--weights random` (seed 0) where `--help` offers it: predict and evaluate try a model offline, as bench
and export do, without reaching for the ImageNet download."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_image_folder


@pytest.fixture
def offline(monkeypatch):
    """No network: any attempt at the ImageNet download fails the test."""
    monkeypatch.setattr(torch.hub, "download_url_to_file",
                        lambda *a, **k: pytest.fail("--weights random tried to download weights"))


def test_predict_with_random_weights(offline, sample_photos, cli):
    result = cli("predict", sample_photos / "dog.jpg", "--model", "squeezenet1_1", "--weights", "random", "--json")
    assert result.code == 0, result.err
    row = json.loads(result.out)
    assert len(row["topk"]) == 5 and row["file"].endswith("dog.jpg")


def test_evaluate_with_random_weights(offline, tmp_path, cli):
    data = make_image_folder(tmp_path / "data", classes=("n01440764", "n01443537"), train_per_class=1,
                             val_per_class=2, size=32)
    result = cli("evaluate", "--model", "squeezenet1_1", "--weights", "random", "--data", data,
                 "--out", tmp_path / "eval", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["samples"] == 4


def test_the_same_random_model_every_time():
    from inceptionlab.models.registry import load_pretrained_model

    first, _ = load_pretrained_model("squeezenet1_1", "random")
    torch.manual_seed(123)  # the caller's RNG state does not matter, and is left as it was
    state = torch.random.get_rng_state()
    second, _ = load_pretrained_model("squeezenet1_1", "random")
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
