"""Recipes are data: every shipped file loads, the guide's values are exact, bad keys are clear errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers.page_examples import check_example

from inceptionlab.config import RECIPES_DIR, list_recipes, load_recipe
from inceptionlab.data.readers import ARRAY_READERS, READERS
from inceptionlab.engine.optim import build_optimizer, build_scheduler
from inceptionlab.engine.task import TASKS, main_logits, make_task
from inceptionlab.errors import UserError
from inceptionlab.models.registry import available_models, build_model, resolve_data_config

ALL_RECIPES = sorted(p.relative_to(RECIPES_DIR).with_suffix("").as_posix() for p in RECIPES_DIR.rglob("*.yaml"))


@pytest.mark.parametrize("name", ALL_RECIPES)
def test_every_shipped_recipe_loads(name):
    recipe = load_recipe(name)
    assert recipe.name == name, "a recipe's name must match its path (runs are filed under it)"
    assert recipe.description


def test_tiny_imagenet_recipe_holds_the_guides_values():
    r = load_recipe("inception_v3/tiny_imagenet")
    assert (r.model.name, r.model.weights, r.model.num_classes, r.model.aux_loss_weight) == (
        "inception_v3", "imagenet", None, None)
    assert (r.optim.name, r.optim.lr, r.optim.momentum, r.optim.weight_decay) == ("sgd", 0.1, 0.9, 1e-4)
    assert (r.schedule.name, r.schedule.step_size, r.schedule.gamma, r.schedule.warmup_epochs) == ("steplr", 30, 0.1, 0)
    assert (r.train.epochs, r.train.batch_size, r.train.precision, r.train.label_smoothing) == (90, 32, "fp32", 0.0)
    assert (r.data.train_crop_size, r.data.val_resize_size, r.data.val_crop_size) == (299, 342, 299)
    assert r.data.interpolation == "bilinear"
    assert r.data.mean == [0.485, 0.456, 0.406] and r.data.std == [0.229, 0.224, 0.225]
    assert r.data.train_crop_scale == [0.08, 1.0]  # RandomResizedCrop's default, as in the guide
    assert r.data.hflip is False


def test_base_inheritance_and_overrides(tmp_path):
    child = tmp_path / "child.yaml"
    child.write_text(f"base: {RECIPES_DIR / 'inception_v3' / 'tiny_imagenet.yaml'}\nname: mine\ntrain:\n  epochs: 3\n")
    r = load_recipe(child, ["optim.lr=0.01", "model.weights=null", "train.precision=bf16"])
    assert r.name == "mine" and r.train.epochs == 3 and r.train.batch_size == 32  # inherited
    assert r.optim.lr == 0.01 and r.model.weights is None and r.train.precision == "bf16"


@pytest.mark.parametrize(
    "override, words",
    [
        ("train.epoch=3", "train.epoch"),  # typo: unknown key
        ("optim.lr=fast", "optim.lr"),  # wrong type
        ("data.val_resize_size=100", "val_resize_size"),  # smaller than the crop
        ("train.epochs", "key=value"),  # malformed
    ],
)
def test_bad_override_is_a_clear_error(override, words):
    with pytest.raises(UserError) as err:
        load_recipe("inception_v3/tiny_imagenet", [override])
    assert words in str(err.value)
    assert "\n" not in str(err.value)


def test_trains_one_line_errors_on_a_bad_recipe_are_the_pages(cli, tmp_path):
    """A misspelt key, and a crop the filled-in resize cannot hold: refused before any data is read."""
    typo = cli("train", "inception_v3/tiny_imagenet", "--set", "train.epoch=3")
    assert typo.code == 2 and len(typo.err.strip().splitlines()) == 1
    check_example("recipes-unknown-key", typo.err)
    crop = cli("train", "inception_v3/imagefolder", "--data", tmp_path, "--out", tmp_path / "runs",
               "--set", "model.name=resnet50", "--set", "data.val_crop_size=300")
    assert crop.code == 2 and not (tmp_path / "runs").exists()
    check_example("recipes-crop-too-large", crop.err)


def test_unknown_key_in_file_names_file_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\noptim:\n  learning_rate: 0.1\n")
    with pytest.raises(UserError) as err:
        load_recipe(bad)
    assert str(bad) in str(err.value) and "optim.learning_rate" in str(err.value)


def test_base_loop_is_an_error(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(UserError, match="loops"):
        load_recipe(tmp_path / "a.yaml")


def test_cli_lists_and_shows_recipes(cli):
    listed = cli("recipes")
    assert listed.code == 0 and "inception_v3/tiny_imagenet" in listed.out
    shown = cli("recipes", "--show", "inception_v3/tiny_imagenet")
    assert shown.code == 0 and "lr: 0.1" in shown.out and "step_size: 30" in shown.out
    assert {n for n, _ in list_recipes()} == set(ALL_RECIPES)


@pytest.mark.parametrize(
    "override, key, valid",
    [
        ("optim.name=lamb", "optim.name", "sgd, adamw, adam"),
        ("schedule.name=onecycle", "schedule.name", "steplr, cosine, constant"),
        ("task=regression", "task", "multiclass, binary"),
        ("train.precision=fp8", "train.precision", "fp32, bf16, fp16"),
        ("train.best_metric=val_top3", "train.best_metric", "val_top1"),
        ("data.reader=coco", "data.reader", "imagefolder"),
        ("data.loader=dali", "data.loader", "resident"),
    ],
)
def test_choices_are_checked_against_the_engine_tables_at_load(override, key, valid):
    from inceptionlab.engine.choices import load_training_recipe

    with pytest.raises(UserError) as err:
        load_training_recipe("inception_v3/tiny_imagenet", [override])
    message = str(err.value)
    assert f"{key}=" in message and valid in message and "\n" not in message


def test_a_new_table_entry_is_a_valid_choice_with_no_second_list(monkeypatch):
    from inceptionlab.engine import choices, optim

    monkeypatch.setitem(optim.OPTIMIZERS, "lamb", optim.OPTIMIZERS["adamw"])
    recipe = choices.load_training_recipe("inception_v3/tiny_imagenet", ["optim.name=lamb"])
    assert recipe.optim.name == "lamb"


def test_every_shipped_recipe_passes_the_table_checks():
    from inceptionlab.engine.choices import load_training_recipe

    for name, _ in list_recipes():
        assert load_training_recipe(name).name == name


@pytest.mark.slow
def test_a_built_wheel_ships_every_recipe(tmp_path):
    """A plain (non-editable) install has the recipes: they are package data, not files beside the repo."""
    import shutil
    import subprocess
    import sys
    import zipfile
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    project = tmp_path / "project"  # a copy, so the build leaves nothing in the checkout
    shutil.copytree(repo / "src", project / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(repo / name, project / name)
    # --no-build-isolation: no network at test time; the test extra installs setuptools>=77 (the build backend).
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(project),
                    "-w", str(tmp_path / "dist")], check=True, capture_output=True, timeout=240)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n.split("inceptionlab/recipes/", 1)[1] for n in names if "/recipes/" in n}
    assert shipped == {f"{name}.yaml" for name in ALL_RECIPES}
    # Every module of every subpackage and every resource (sample pictures, the page) is in it too.
    package = repo / "src" / "inceptionlab"
    in_tree = {f"inceptionlab/{p.relative_to(package).as_posix()}" for p in package.rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert in_tree - set(names) == set()


# Readers whose samples are token ids (a model input of shape (batch, sequence_length)), not images.
TOKEN_READERS = {"imdb"}


def example_input(recipe) -> torch.Tensor:
    """One sample of what the recipe's reader feeds the model, without reading any data."""
    data = recipe.data
    if data.reader in TOKEN_READERS:
        return torch.randint(0, data.text.max_tokens + 1, (1, data.text.sequence_length))
    return torch.rand(1, len(data.mean), data.val_crop_size, data.val_crop_size)  # one channel per mean value


@pytest.mark.parametrize("name", ALL_RECIPES)
def test_every_recipe_resolves_against_the_registry_and_readers(name):
    """Like litgpt's config hub test: each shipped recipe names things that exist and fit together."""
    recipe = load_recipe(name)
    # Preprocessing fields left empty come from the model's weights, as when a session is built.
    recipe = dataclasses.replace(recipe, data=resolve_data_config(recipe.data, recipe.model.name))
    assert recipe.model.name in available_models()
    assert recipe.data.reader in {*READERS, *ARRAY_READERS}
    assert recipe.task in TASKS
    classes = recipe.model.num_classes or (2 if recipe.task == "binary" else 3)
    # No weights and no data: the architecture with the recipe's own builder arguments.
    built = build_model(recipe.model.name, classes, None, recipe.model.aux_loss_weight, **recipe.model.kwargs)
    with torch.no_grad():
        logits = main_logits(built.model.eval()(example_input(recipe)))
    assert logits.shape == (1, 1 if recipe.task == "binary" else classes)
    task = make_task(recipe.task, classes, recipe.train.label_smoothing, recipe.model.aux_loss_weight)
    assert torch.isfinite(task.loss(logits, torch.tensor([1])))
    optimizer = build_optimizer(built.model.parameters(), recipe.optim)
    build_scheduler(optimizer, recipe.schedule, recipe.train.epochs)
