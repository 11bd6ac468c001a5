"""timm as a model source (models/timm_source.py): `model.name=timm/<name>` builds any timm model; its
pretrained config is the run's preprocessing; its classifier and group_matcher are the head and the layers;
its pretrained weights come from the Hugging Face cache, a download is said before it is tried; a run of a
timm model goes through train, predict, evaluate and the error report like any other."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from conftest import make_image_folder

from inceptionlab.errors import UserError
from inceptionlab.models.parts import model_parts
from inceptionlab.models.registry import build_model, model_preprocessing
from inceptionlab.models.spec import Preprocessing

timm = pytest.importorskip("timm", reason="the timm extra: pip install 'inceptionlab[timm]'")


def test_the_head_and_the_layers_are_timms_own():
    """The head is what get_classifier() returns; the body's layers are group_matcher()'s groups in order
    (the stem, then each block, then the last block with the final convolution), the head left out."""
    from timm.models import group_parameters

    built = build_model("timm/tf_efficientnet_lite0", 5, None)
    parts = model_parts(built.model, 5)
    assert parts.head_modules == ("classifier",) and parts.head == ("classifier.weight", "classifier.bias")
    groups = group_parameters(built.model, built.model.group_matcher(coarse=False))
    expected = [tuple(groups[k]) for k in sorted(groups) if not groups[k][0].startswith("classifier.")]
    assert [layer.params for layer in parts.layers] == expected
    assert parts.layers[0].name == "conv_stem, bn1" and parts.layers[1].name == "blocks.0.0"
    assert sorted([*parts.head, *parts.body]) == sorted(n for n, _ in built.model.named_parameters())


def test_the_pretrained_config_is_the_preprocessing():
    """tf_efficientnet_lite0's config: 224 px, crop_pct 0.875 (resize 256), bicubic, mean = std = 0.5."""
    assert model_preprocessing("timm/tf_efficientnet_lite0") == Preprocessing(256, 224, "bicubic", (0.5,) * 3,
                                                                               (0.5,) * 3)


def test_an_unknown_timm_model_is_a_one_line_error_with_close_names():
    with pytest.raises(UserError, match=r"no timm model 'resnet_18'.*timm/resnet18"):
        build_model("timm/resnet_18", 3, None)


def write_hf_cache(cache, repo, state):
    """The Hugging Face cache's layout for one file of `repo` (refs/main -> a snapshot)."""
    from safetensors.torch import save_file

    folder = cache / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("0" * 40)
    save_file({k: v.contiguous() for k, v in state.items()}, snapshot / "model.safetensors")


def test_pretrained_weights_come_from_the_cache_with_their_rows_by_wnid(tmp_path, monkeypatch):
    import huggingface_hub

    torch.manual_seed(0)
    source = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    write_hf_cache(tmp_path, "timm/tf_efficientnet_lite0.in1k", source.state_dict())
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    built = build_model("timm/tf_efficientnet_lite0", 2, "imagenet", class_names=["n01443537", "n01440764"])
    assert torch.equal(built.model.conv_head.weight, source.conv_head.weight)
    assert torch.equal(built.model.classifier.weight[0], source.classifier.weight[1])  # goldfish is ImageNet's 1
    assert built.record["expects"]["from"] == "timm's pretrained config of timm/tf_efficientnet_lite0"
    assert built.record["file"].endswith("model.safetensors")


def test_pretrained_weights_not_cached_are_announced_then_refused_offline(tmp_path, monkeypatch, caplog):
    import huggingface_hub
    import timm.models._hub

    def offline(*args, **kwargs):
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(timm.models._hub, "hf_hub_download", offline)
    with caplog.at_level(logging.WARNING, logger="inceptionlab"), pytest.raises(UserError, match="not downloadable"):
        build_model("timm/tf_efficientnet_lite0", 2, "imagenet")
    assert any("downloading" in r.getMessage() and "tf_efficientnet_lite0.in1k" in r.getMessage()
               for r in caplog.records)


def test_a_timm_run_trains_head_first_then_predicts_evaluates_and_reports(tmp_path, cli):
    """Head-only epoch on cached features (the pre-hook on timm's classifier), then the whole model with
    timm's groups as layer-wise rates; the run directory rebuilds the timm model for predict, evaluate and
    the error report's Grad-CAM (the last spatial map: bn2)."""
    data = make_image_folder(tmp_path / "data", train_per_class=4, val_per_class=2, size=64)
    result = cli("train", "inception_v3/imagefolder", "--data", data, "--out", tmp_path / "runs", "--no-progress",
                 "--json", *[x for item in [
                     "model.name=timm/tf_efficientnet_lite0", "model.weights=null", "finetune.body_lr_mult=1", "train.epochs=2",
                     "finetune.freeze_epochs=1", "finetune.layer_decay=0.75", "data.train_crop_size=64",
                     "data.val_resize_size=64", "data.val_crop_size=64", "train.batch_size=4", "data.num_workers=0",
                     "train.precision=fp32", "train.compile=false", "train.channels_last=false"]
                     for x in ("--set", item)])
    assert result.code == 0, result.err
    run = json.loads(result.out.splitlines()[-1])["run_dir"]
    spec = json.loads((Path(run) / "spec.json").read_text())
    assert spec["arch"] == "timm/tf_efficientnet_lite0" and spec["interpolation"] == "bicubic"
    predicted = cli("predict", next((data / "val" / "dog").iterdir()), "--run", run, "--json")
    assert predicted.code == 0, predicted.err
    assert json.loads(predicted.out)["answer"] in ("cat", "dog", "fox")
    evaluated = cli("evaluate", run, "--json")
    assert evaluated.code == 0, evaluated.err
    reported = cli("report", run, "--cam", "2", "--json")
    assert reported.code == 0, reported.err
    served_over_kserve(Path(run), next((data / "val" / "dog").iterdir()))


def served_over_kserve(run: Path, photo: Path) -> None:
    """Served under a name a URL can carry: 'timm/...' as the model's name left /v2/models/timm/<name> with
    no route (failed on 385b6d1: 'no route GET /v2/models/timm/tf_efficientnet_lite0')."""
    from fastapi.testclient import TestClient

    from inceptionlab.serve.app import create_app
    from inceptionlab.serve.models import ModelLoadSettings, load_served_model
    from inceptionlab.serve.service import RequestSettings

    settings = ModelLoadSettings(backend="eager", precision="fp32", device="cpu", max_batch=2, instances=1,
                                 max_delay_ms=1, log=lambda message: None)
    served = load_served_model(settings, run_dir=run)
    assert served.name == "timm_tf_efficientnet_lite0"
    with TestClient(create_app([served], RequestSettings())) as client:
        assert client.get(f"/v2/models/{served.name}").json()["name"] == served.name
        answer = client.post("/v1/classify", files={"file": (photo.name, photo.read_bytes())}).json()
        assert answer["model"] == served.name and answer["results"][0]["answer"] in ("cat", "dog", "fox")
