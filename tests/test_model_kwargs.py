"""Any registry model from any recipe: builder arguments checked against the chosen model, `--set` drops them."""

from __future__ import annotations

from conftest import make_image_folder
from helpers.page_examples import check_example

# The demo recipe's smallest settings that still build and train a resnet18 (8x8 digits upsampled to 32 px).
TINY = ["data.train_crop_size=32", "data.val_resize_size=32", "data.val_crop_size=32", "train.epochs=1",
        "data.max_train_samples=8", "data.max_val_samples=8", "train.batch_size=4", "model.weights=null"]


def sets(*items: str) -> list[str]:
    return [x for item in items for x in ("--set", item)]


def test_a_kwarg_the_chosen_model_does_not_take_is_a_one_line_error(tmp_path, cli):
    """demo/digits sets model.kwargs.dropout (Inception v3 takes it); resnet18 does not. On f11b22f this
    died inside ResNet.__init__ with a TypeError (exit 70, a traceback)."""
    result = cli("train", "demo/digits", "--data", tmp_path / "digits", "--out", tmp_path / "runs", "--no-progress",
                 *sets("model.name=resnet18", *TINY))
    assert result.code == 2, result.err
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.err
    message = lines[0]
    assert "model.kwargs.dropout" in message and "resnet18" in message
    assert "zero_init_residual" in message  # one of resnet18's own arguments, listed as the fix
    assert "Traceback" not in result.err
    check_example("recipes-model-kwargs", result.err)


def test_set_null_drops_a_kwarg_and_a_mapping_replaces_them_all(tmp_path, cli):
    data = make_image_folder(tmp_path / "data", train_per_class=2, val_per_class=1)
    common = ["--data", data, "--out", tmp_path / "runs", "--no-progress", "--json", *sets(*TINY, "data.reader=imagefolder")]
    dropped = cli("train", "demo/digits", *common, *sets("model.name=resnet18", "model.kwargs.dropout=null"))
    assert dropped.code == 0, dropped.err
    cleared = cli("train", "demo/digits", *common, *sets("model.name=resnet18", "model.kwargs={}"))
    assert cleared.code == 0, cleared.err
    replaced = cli("train", "demo/digits", *common, *sets("model.name=resnet18", "model.kwargs={zero_init_residual: true}"))
    assert replaced.code == 0, replaced.err


def test_kwargs_a_model_takes_pass_through(tmp_path):
    from inceptionlab.models.registry import build_model

    built = build_model("resnet18", 3, None, zero_init_residual=True)
    assert float(built.model.layer1[0].bn2.weight.detach().abs().sum()) == 0.0  # what zero_init_residual does
