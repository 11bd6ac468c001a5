"""Starting weights as users have them, loaded by a shape contract (models/weights.py): the body must fit and
the head is optional; DDP's and torch.compile's key prefixes and the common checkpoint wrappers are unwrapped
and said; a `model.pt` inside a run reads that run's spec.json; the input the weights expect (mean, std,
Inception's transform_input) comes from the weights' own record, never a guess from the new recipe; every
decision is printed and recorded in the run (weights.json)."""

from __future__ import annotations

import json

import pytest
from helpers.page_examples import check_example
import torch
import torchvision
from conftest import make_image_folder

from inceptionlab.config import load_recipe
from inceptionlab.models.registry import build_model
from inceptionlab.models.spec import IMAGENET_MEAN, IMAGENET_STD, ModelSpec

HALF = [0.5, 0.5, 0.5]
SMALL = ["data.train_crop_size=75", "data.val_resize_size=75", "data.val_crop_size=75", "data.num_workers=0",
         "data.loader=workers", "train.batch_size=2", "train.precision=fp32", "train.compile=false",
         "train.channels_last=false", "train.epochs=1"]


def resnet18_state(num_classes=1000):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=num_classes)
    return model, model.state_dict()


def line_with(report, text):
    found = [line for line in report if text in line]
    assert found, f"no line with {text!r} in {report}"
    return found[0]


# --------------------------------------------------------------------------- the head is optional


def test_a_body_only_state_dict_gets_a_new_head_and_says_so(tmp_path):
    """A self-supervised checkpoint (DINO, MoCo) or timm's num_classes=0 holds the body alone. Failed on
    da3203a: '2 tensors missing ... first missing: fc.weight; is it a different model?'."""
    source, state = resnet18_state()
    torch.save({k: v for k, v in state.items() if not k.startswith("fc.")}, tmp_path / "body.pt")
    built = build_model("resnet18", 3, str(tmp_path / "body.pt"))
    assert torch.equal(built.model.layer4[1].conv2.weight, source.layer4[1].conv2.weight)
    assert torch.equal(built.model.bn1.running_var, source.bn1.running_var)
    assert built.model.fc.out_features == 3
    line_with(built.report, "head fc starts new (the weights have no head)")


def test_an_inception_body_gets_its_new_head_and_auxiliary_head(tmp_path):
    """Google's Inception v3 body as converted (no fc, no AuxLogits), with the auxiliary loss on: both
    heads start new, every body tensor is the file's."""
    torch.manual_seed(0)
    source = torchvision.models.inception_v3(weights=None, aux_logits=False, init_weights=False)
    body = {k: v for k, v in source.state_dict().items() if not k.startswith("fc.")}
    torch.save(body, tmp_path / "inception_body.pt")
    built = build_model("inception_v3", 4, str(tmp_path / "inception_body.pt"), aux_loss_weight=0.4)
    assert torch.equal(built.model.Mixed_7c.branch_pool.conv.weight, source.Mixed_7c.branch_pool.conv.weight)
    assert built.model.fc.out_features == 4 and built.model.AuxLogits.fc.out_features == 4
    line_with(built.report, "head fc starts new (the weights have no head)")
    line_with(built.report, "AuxLogits starts new")


# --------------------------------------------------------------------------- wrappers and prefixes


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.", "module._orig_mod."])
def test_ddp_and_compile_prefixes_are_removed_and_said(tmp_path, prefix):
    """A DDP model's state_dict (module.), a compiled one's (_orig_mod.), or both. Failed on da3203a:
    '122 tensors missing, 122 unexpected'."""
    source, state = resnet18_state(num_classes=3)
    torch.save({prefix + k: v for k, v in state.items()}, tmp_path / "w.pt")
    built = build_model("resnet18", 3, str(tmp_path / "w.pt"))
    assert all(torch.equal(built.model.state_dict()[k], v) for k, v in state.items())
    for part in prefix.rstrip(".").split("."):
        line_with(built.report, f"'{part}.' removed")


@pytest.mark.parametrize("wrap,key", [
    (lambda sd: {"state_dict": sd, "epoch": 7}, "state_dict"),
    (lambda sd: {"model": sd, "optimizer": {"state": {}}, "epoch": 3}, "model"),  # DeiT, MAE
    (lambda sd: {"model_state_dict": sd, "optimizer_state_dict": {}}, "model_state_dict"),  # PyTorch's tutorial
    (lambda sd: {"state_dict": {"module." + k: v for k, v in sd.items()}, "arch": "resnet18"}, "state_dict"),
], ids=["state_dict", "model", "model_state_dict", "state_dict+module"])
def test_common_checkpoint_wrappers_are_unwrapped_and_said(tmp_path, wrap, key):
    """Failed on da3203a: {"state_dict": ...} gave 'expected a state_dict (dict of tensors), got dict'; a foreign
    {"model": ...} checkpoint loaded without a word about where in the file the weights were."""
    source, state = resnet18_state(num_classes=3)
    torch.save(wrap(state), tmp_path / "ckpt.pth")
    built = build_model("resnet18", 3, str(tmp_path / "ckpt.pth"))
    assert all(torch.equal(built.model.state_dict()[k], v) for k, v in state.items())
    line_with(built.report, f"unwrapped from {key!r}")


def test_a_self_supervised_checkpoint_gives_its_encoder(tmp_path):
    """MoCo's layout: two encoders under `module.encoder_q.` / `module.encoder_k.`, an MLP projection where the
    classifier would be, a queue. The query encoder's body is taken, its projection left out, each said."""
    source, state = resnet18_state(num_classes=128)
    body = {k: v for k, v in state.items() if not k.startswith("fc.")}
    mlp = {"fc.0.weight": torch.randn(512, 512), "fc.0.bias": torch.zeros(512), "fc.2.weight": torch.randn(128, 512),
           "fc.2.bias": torch.zeros(128)}
    checkpoint = {"epoch": 200, "arch": "resnet18", "state_dict": {
        **{f"module.encoder_q.{k}": v for k, v in {**body, **mlp}.items()},
        **{f"module.encoder_k.{k}": torch.zeros_like(v) for k, v in {**body, **mlp}.items()},
        "module.queue": torch.randn(128, 65536 // 64)}}
    torch.save(checkpoint, tmp_path / "moco_v2_800ep.pth.tar")
    built = build_model("resnet18", 3, str(tmp_path / "moco_v2_800ep.pth.tar"))
    assert torch.equal(built.model.layer3[0].conv1.weight, source.layer3[0].conv1.weight)
    line_with(built.report, "the tensors under 'encoder_q.' taken")
    line_with(built.report, "head fc starts new (the weights' fc.0, fc.2 is of another form)")
    check_example("fine-tuning-moco", "\n".join(built.report).replace(f"{tmp_path}/", ""),
                  labels=["resnet18", "resnet50"])  # the page's is a resnet50


def test_weights_that_do_not_fit_name_both_sides(tmp_path):
    """The refusal names a missing and an unexpected tensor (the fix is usually visible in the pair)."""
    from inceptionlab.errors import UserError

    _, state = resnet18_state()
    torch.save({k.replace("layer", "stage"): v for k, v in state.items()}, tmp_path / "other.pt")
    with pytest.raises(UserError, match=r"first missing: layer1\.0\.conv1\.weight.*first unexpected: stage1\.0\.conv1"):
        build_model("resnet18", 3, str(tmp_path / "other.pt"))


# --------------------------------------------------------------------------- what the weights expect


def make_run(folder, *, mean, std, transform_input, classes=("cat", "dog")):
    """A run directory as `train` leaves one: spec.json and model.pt of an Inception v3 (75 px)."""
    torch.manual_seed(1)
    model = torchvision.models.inception_v3(weights=None, num_classes=len(classes), aux_logits=False,
                                            transform_input=transform_input, init_weights=False)
    folder.mkdir(parents=True)
    torch.save(model.state_dict(), folder / "model.pt")
    ModelSpec(arch="inception_v3", num_classes=len(classes), class_names=list(classes), crop_size=75, resize_size=75,
              mean=list(mean), std=list(std),
              arch_kwargs={"aux_logits": False, "transform_input": transform_input, "init_weights": False}
              ).save(folder / "spec.json")
    return model


def first_conv_input(session, pixels):
    seen = []
    hook = session.model.Conv2d_1a_3x3.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    session.model.eval()
    with torch.no_grad():
        session.model(session.settings.prepare(pixels))
    hook.remove()
    return seen[0]


def normalised(pixels, mean, std):
    mean, std = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    return (pixels.float() / 255 - mean) / std


@pytest.mark.parametrize("run_mean,run_std,run_tf,recipe_norm", [
    (IMAGENET_MEAN, IMAGENET_STD, False, None),  # a run from scratch; the new recipe leaves mean/std to the weights
    (HALF, HALF, False, None),  # the demo's normalisation
    (HALF, HALF, False, (IMAGENET_MEAN, IMAGENET_STD)),  # bridged by transform_input
    (IMAGENET_MEAN, IMAGENET_STD, True, (HALF, HALF)),  # a run fine-tuned from Google's weights
], ids=["scratch-imagenet", "half", "half-to-imagenet", "google-to-half"])
def test_a_model_pt_inside_a_run_reads_the_runs_spec(tmp_path, run_mean, run_std, run_tf, recipe_norm):
    """`model.weights=RUN/model.pt`: the first convolution sees what it saw in that run, whatever the new
    recipe's normalisation, and the head's rows are carried by the run's class names. Failed on da3203a
    (scratch-imagenet): transform_input was guessed true from the new recipe's ImageNet mean/std, so the
    network met [-1, 1] inputs it was never trained on, without a note; 'head fc starts new' where the run
    carries both classes by name."""
    from inceptionlab.engine.session import build_training_session

    run = tmp_path / "runA"
    trained = make_run(run, mean=run_mean, std=run_std, transform_input=run_tf)
    data = make_image_folder(tmp_path / "data", classes=("cat", "dog", "fox"), train_per_class=2, val_per_class=1,
                             size=80)
    norm = [] if recipe_norm is None else [f"data.mean={list(recipe_norm[0])}", f"data.std={list(recipe_norm[1])}"]
    recipe = load_recipe("inception_v3/imagefolder", [f"data.root={data}", f"model.weights={run / 'model.pt'}",
                                                      *SMALL, *norm])
    session = build_training_session(recipe)
    pixels = torch.randint(0, 256, (2, 3, 75, 75), dtype=torch.uint8)
    expected = normalised(pixels, [0.5] * 3 if run_tf else run_mean, [0.5] * 3 if run_tf else run_std)
    assert torch.allclose(first_conv_input(session, pixels), expected, atol=1e-5)
    if recipe_norm is None:  # what the recipe leaves empty comes from the weights
        assert session.spec.mean == pytest.approx(list(run_mean)) and session.spec.std == pytest.approx(list(run_std))
    line_with(session.weights_notes, str(run / "spec.json"))
    line_with(session.weights_notes, "2 of 3 classes carried over by name, new: fox")
    assert torch.equal(session.model.fc.weight[1], trained.fc.weight[1])  # dog


def test_a_recipe_normalisation_the_weights_were_not_trained_with_is_warned(tmp_path):
    """A run from scratch on ImageNet's mean/std continued with the demo's 0.5/0.5: no transform_input can
    make that up, so the run says which setting differs and how to fix it."""
    from inceptionlab.engine.session import build_training_session

    run = tmp_path / "runA"
    make_run(run, mean=IMAGENET_MEAN, std=IMAGENET_STD, transform_input=False)
    data = make_image_folder(tmp_path / "data", classes=("cat", "dog"), train_per_class=2, val_per_class=1, size=80)
    recipe = load_recipe("inception_v3/imagefolder", [f"data.root={data}", f"model.weights={run}", *SMALL,
                                                      f"data.mean={HALF}", f"data.std={HALF}"])
    session = build_training_session(recipe)
    warning = line_with(session.weights_notes, "warning:")
    assert "data.mean" in warning and "0.485" in warning


def test_a_sidecar_gives_the_input_a_weights_file_expects(tmp_path):
    """`w.pt` with `w.json` beside it: its mean/std fill the recipe's empty ones and the run says where they
    came from. Failed on da3203a: the sidecar was never read (ImageNet's mean/std from resnet18's defaults)."""
    from inceptionlab.engine.session import build_training_session

    _, state = resnet18_state()
    torch.save(state, tmp_path / "w.pt")
    (tmp_path / "w.json").write_text(json.dumps({"arch": "resnet18", "mean": HALF, "std": HALF}))
    data = make_image_folder(tmp_path / "data", classes=("cat", "dog"), train_per_class=2, val_per_class=1, size=40)
    recipe = load_recipe("inception_v3/imagefolder", [f"data.root={data}", f"model.weights={tmp_path / 'w.pt'}",
                                                      "model.name=resnet18", *SMALL])
    session = build_training_session(recipe)
    assert session.spec.mean == HALF and session.spec.std == HALF
    line_with(session.weights_notes, str(tmp_path / "w.json"))


def test_a_plain_inception_file_says_what_input_it_is_taken_to_expect(tmp_path):
    """No spec, no sidecar: the convention of torchvision's own file for that architecture is assumed (Google's
    [-1, 1], so transform_input for ImageNet's mean/std), and said, with the way to state otherwise."""
    source = torchvision.models.inception_v3(weights=None, aux_logits=False, init_weights=False)
    torch.save(source.state_dict(), tmp_path / "google.pth")
    built = build_model("inception_v3", 3, str(tmp_path / "google.pth"),
                        normalisation=(list(IMAGENET_MEAN), list(IMAGENET_STD)))
    assert built.model.transform_input is True
    line = line_with(built.report, "google.json")
    assert "transform_input" in line


# --------------------------------------------------------------------------- recorded in the run


def test_every_decision_is_recorded_in_the_run(tmp_path, capsys):
    """weights.json beside spec.json: the file, its checksum, what was unwrapped, the input it expects and
    where that came from, the lines the run printed. Failed on da3203a: nothing was recorded."""
    from inceptionlab.engine.fit import fit
    from inceptionlab.fileio import sha256_file

    torch.manual_seed(0)
    source = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                 torch.nn.Conv2d(6, 16, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                                 torch.nn.Linear(400, 120), torch.nn.ReLU(), torch.nn.Linear(120, 84), torch.nn.ReLU())
    file = tmp_path / "body.pt"
    torch.save({"state_dict": {"module." + k: v for k, v in source.state_dict().items()}}, file)
    data = make_image_folder(tmp_path / "data", classes=("cat", "dog"), train_per_class=4, val_per_class=2, size=32)
    recipe = load_recipe("inception_v3/imagefolder", [
        f"data.root={data}", f"model.weights={file}", "model.name=cifar10_cnn", "data.train_crop_size=32",
        "data.val_resize_size=32", "data.val_crop_size=32", "data.num_workers=0", "train.batch_size=4",
        "train.epochs=1", "train.precision=fp32", "train.compile=false", "train.channels_last=false"])
    outcome = fit(recipe, tmp_path / "runs", progress=False)
    printed = capsys.readouterr().out
    record = json.loads((outcome.run_dir / "weights.json").read_text())
    assert record["file"] == str(file) and record["sha256"] == sha256_file(file)
    assert record["unwrapped"] == ["state_dict"] and record["prefixes_removed"] == ["module."]
    assert record["head"] == "new" and record["expects"]["mean"] == HALF
    assert record["expects"]["from"] == "cifar10_cnn's defaults (nothing recorded with the weights)"
    assert record["lines"] and all(line in printed for line in record["lines"])


# --------------------------------------------------------------------------- no download the user cannot see coming


# --------------------------------------------------------------------------- ImageNet's rows by WordNet id


def test_a_dataset_of_imagenet_classes_keeps_the_pretrained_rows_by_wnid(inception_hub, tmp_path):
    """tiny-imagenet names its classes by wnid: the 1000-class head's rows of those classes are carried over,
    so the model answers before any training (zero-shot); folders named otherwise fall back to counts."""
    hub = inception_hub["state"]
    built = build_model("inception_v3", 2, "imagenet", class_names=["n01443537", "n01440764"])  # goldfish, tench
    assert torch.equal(built.model.fc.weight[0], hub["fc.weight"][1])
    assert torch.equal(built.model.fc.bias[1], hub["fc.bias"][0])
    line_with(built.report, "2 of 2 classes carried over by name (of the weights' 1000)")
    assert built.record["head"] == "replaced" and built.record["rows_carried"] == 2
    others = build_model("inception_v3", 2, "imagenet", class_names=["cat", "dog"])
    line_with(others.report, "head fc starts new (1000 classes in the weights, 2 here)")
