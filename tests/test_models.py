"""The registry: any torchvision classifier, pretrained weights from the hub cache, head replacement."""

from __future__ import annotations

import pytest
import torch
import torchvision

from inceptionlab.errors import UserError
from inceptionlab.models.registry import (
    available_models,
    build_model,
    pretrained_spec,
    rebuild_model,
)
from inceptionlab.models.spec import ModelSpec
from helpers.page_examples import check_example


def own_models() -> list[str]:
    """The models registered by inceptionlab itself (the guide's small networks)."""
    return sorted(set(available_models()) - set(torchvision.models.list_models(module=torchvision.models)))


# One example input per model: ours by what they take, torchvision's images at a small size they accept
# (Inception v3's smallest is 75 px). A model registered without an entry here fails
# test_every_own_model_has_an_example_input, so new registrations get the tests below.
OWN_INPUTS = {
    "cifar10_cnn": lambda: torch.rand(2, 3, 32, 32),
    "fashion_mlp": lambda: torch.rand(2, 1, 28, 28),
    "text_classifier": lambda: torch.randint(0, 10_001, (2, 20)),
    "inception_v3_fid": lambda: torch.rand(2, 3, 75, 75),  # Inception v3's smallest input
}
TORCHVISION_MODELS = {  # the torchvision models the project's recipes, demo and benchmarks use
    "inception_v3": 75, "resnet18": 64, "mobilenet_v3_small": 64, "squeezenet1_0": 64, "googlenet": 64,
}
MODELS = sorted(OWN_INPUTS) + sorted(TORCHVISION_MODELS)


def example_input(name: str) -> torch.Tensor:
    if name in OWN_INPUTS:
        return OWN_INPUTS[name]()
    size = TORCHVISION_MODELS[name]
    return torch.rand(2, 3, size, size)


@pytest.fixture(scope="module")
def scratch():
    """build_model(name, 7 classes, no weights), built once per model for this file's three tests
    (Inception v3's random init alone takes ~1.5 s on 2 cores)."""
    built = {}

    def get(name: str):
        if name not in built:
            torch.manual_seed(0)
            built[name] = build_model(name, num_classes=7, weights=None)
        return built[name]

    return get


def test_every_own_model_has_an_example_input():
    assert own_models() == sorted(OWN_INPUTS)


@pytest.mark.parametrize("name", MODELS)
def test_forward_outputs_one_logit_per_class(name, scratch):
    with torch.no_grad():
        out = scratch(name).model.eval()(example_input(name))
    assert out.shape == (2, 7)


@pytest.mark.parametrize("name", MODELS)
def test_backward_reaches_every_parameter(name, scratch):
    model = scratch(name).model.train()
    model.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(example_input(name)), torch.tensor([1, 6]))
    loss.backward()
    for param_name, param in model.named_parameters():
        assert param.grad is not None, f"{param_name} got no gradient"
        assert torch.isfinite(param.grad).all(), param_name
    assert any(p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("name", MODELS)
def test_state_dict_round_trips_through_a_file_and_the_spec(name, scratch, tmp_path):
    """Save the weights and the spec, rebuild from the spec alone, load: the same outputs."""
    built = scratch(name)
    torch.save(built.model.state_dict(), tmp_path / "model.pt")
    ModelSpec(name, 7, [str(i) for i in range(7)], arch_kwargs=built.arch_kwargs).save(tmp_path / "spec.json")
    again = rebuild_model(ModelSpec.load(tmp_path / "spec.json"))
    again.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))  # strict: same tree
    x = example_input(name)
    with torch.no_grad():
        assert torch.equal(again.eval()(x), built.model.eval()(x))


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small", "squeezenet1_0", "efficientnet_b0"])
def test_head_replacement_is_generic(tmp_path, name):
    """Load 1000-class weights from a file, get a 7-class model whose body kept the weights."""
    source = torchvision.models.get_model(name, weights=None)
    path = tmp_path / "w.pt"
    torch.save(source.state_dict(), path)
    built = build_model(name, num_classes=7, weights=str(path))
    assert built.model.eval()(torch.rand(1, 3, 64, 64)).shape == (1, 7)
    kept = [k for k, v in built.model.state_dict().items() if k in source.state_dict() and v.shape == source.state_dict()[k].shape]
    assert all(torch.equal(built.model.state_dict()[k], source.state_dict()[k]) for k in kept)
    assert len(kept) >= len(source.state_dict()) - 2  # only the head's weight and bias differ


def test_inception_finetune_drops_aux_and_sets_transform_input(inception_hub):
    built = build_model("inception_v3", num_classes=200, weights="imagenet")
    model = built.model
    assert model.fc.out_features == 200 and model.AuxLogits is None and model.aux_logits is False
    assert model.transform_input is True  # Google's weights expect [-1, 1] inputs
    assert torch.equal(model.Conv2d_1a_3x3.conv.weight, inception_hub["state"]["Conv2d_1a_3x3.conv.weight"])
    assert built.source_classes[0] == "tench" and len(built.source_classes) == 1000
    model.train()
    assert model(torch.rand(2, 3, 75, 75)).shape == (2, 200)  # a plain tensor: no aux output


def test_inception_keeps_aux_head_when_weighted(inception_hub):
    model = build_model("inception_v3", num_classes=10, weights="imagenet", aux_loss_weight=0.4).model
    assert model.AuxLogits is not None and model.AuxLogits.fc.out_features == 10
    out = model.train()(torch.rand(2, 3, 299, 299))  # the aux head needs 299 px
    assert out.logits.shape == (2, 10) and out.aux_logits.shape == (2, 10)


def test_missing_weights_say_which_file_goes_where(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "empty_hub"))
    monkeypatch.setattr(torch.hub, "download_url_to_file", lambda *a, **k: (_ for _ in ()).throw(OSError("offline")))
    with pytest.raises(UserError) as err:
        build_model("inception_v3", num_classes=10, weights="imagenet")
    message = str(err.value)
    assert "inception_v3_google-0cc3c7bd.pth" in message and "0cc3c7bd" in message
    assert str(tmp_path / "empty_hub" / "checkpoints") in message and "\n" not in message


def test_a_download_of_imagenet_weights_is_said_in_our_words_before_it_starts(tmp_path, monkeypatch, capsys):
    """torch printed its own `Downloading: "<url>" to <path>` line (on stdout, inside `--json` output too)
    before the project's one-line error: a network attempt the user did not see coming, said in another
    program's words."""
    from inceptionlab.models.registry import cached_weights_file

    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "empty_hub"))
    told = []

    def offline(url, dst, *args, **kwargs):
        told.append(capsys.readouterr())  # what the user had read when the network was tried
        raise OSError("offline")

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    with pytest.raises(UserError, match="not found and not downloadable"):
        build_model("resnet18", num_classes=3, weights="imagenet")
    (said,) = told
    after = capsys.readouterr()
    assert "Downloading" not in said.out + said.err + after.out + after.err and said.out == ""
    before = said.err
    assert before.startswith("weights: downloading resnet18's ImageNet weights") and before.count("\n") == 1
    assert str(tmp_path / "empty_hub" / "checkpoints") in before and "resnet18-f37072fd.pth" in before

    # In the cache: read from there, no word and no network.
    target = cached_weights_file("resnet18")
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(torchvision.models.resnet18().state_dict(), target)
    build_model("resnet18", num_classes=3, weights="imagenet")
    assert len(told) == 1 and capsys.readouterr() == ("", "")


def test_predict_without_the_weights_or_a_network_says_what_it_tried_and_which_file_goes_where(
        tmp_path, monkeypatch, sample_photos, cli):
    import urllib.error

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "empty_hub"))
    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    result = cli("predict", sample_photos / "dog.jpg")
    assert result.code == 2
    check_example("first-steps-weights-missing", result.err)


def test_imagenet_if_cached_falls_back_to_scratch(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "empty_hub"))
    built = build_model("inception_v3", num_classes=10, weights="imagenet_if_cached")
    assert built.pretrained is None and built.model.fc.out_features == 10


def test_pretrained_spec_follows_the_weights_metadata():
    spec = pretrained_spec("inception_v3")
    assert (spec.crop_size, spec.resize_size, spec.interpolation) == (299, 342, "bilinear")
    assert spec.num_classes == 1000 and spec.class_names[1] == "goldfish"


def test_unknown_model_is_a_clear_error():
    with pytest.raises(UserError, match="unknown model"):
        build_model("inception_v9", num_classes=3)
    assert "inception_v3" in available_models()


def test_register_model_adds_a_builder_with_its_preprocessing(monkeypatch):
    from torch import nn

    from inceptionlab.models import registry

    monkeypatch.setattr(registry, "_OWN_MODELS", dict(registry._OWN_MODELS))
    monkeypatch.setattr(registry, "_OWN_PREPROCESSING", dict(registry._OWN_PREPROCESSING))
    wanted = registry.Preprocessing(72, 64, "bilinear", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))

    @registry.register_model("my_net", wanted)
    def my_net(num_classes: int = 10) -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 64 * 64, num_classes))

    assert "my_net" in registry.available_models()
    assert registry.model_preprocessing("my_net") == wanted
    assert registry.build_model("my_net", 4).model[1].out_features == 4
