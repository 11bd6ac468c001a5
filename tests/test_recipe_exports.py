"""Every shipped recipe's run exports to ONNX (parity checked) and benchmarks, or says clearly why not.

Each recipe is trained tiny (a few samples, one epoch, small sizes) on small data in its reader's
original format, written by the tests (conftest.py, helpers/datasets.py), then exported and benchmarked
with one configuration, all through the CLI. Recipes that train the same network as another (EXPORTED_AS)
are checked to build it, and that one's run is exported for them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import SHARED_DATA, make_image_folder
from helpers.datasets import write_tiny_imagenet

from inceptionlab.config import list_recipes
from inceptionlab.models.spec import ModelSpec

pytest.importorskip("onnxruntime")

# fp32 training: the export is fp32 whatever the recipe trains in, and CPU bf16 autocast is slower.
TINY = ["train.epochs=1", "data.max_train_samples=16", "data.max_val_samples=8", "data.num_workers=0",
        "train.batch_size=4", "train.eval_batch_size=8", "model.weights=null", "finetune.body_lr_mult=1", "train.precision=fp32"]
# Inception v3's smallest input is 75 px; 86 -> 75 keeps the resize-then-crop step of 342 -> 299.
INCEPTION_75 = ["data.train_crop_size=75", "data.val_resize_size=86", "data.val_crop_size=75"]
BENCH_ONE = ["--backend", "eager", "--precision", "fp32", "--batch", "1", "--iters", "2", "--warmup", "1",
             "--device", "cpu", "--no-plot", "--json"]


def _tiny_imagenet(tmp: Path) -> Path:
    from inceptionlab.data.datasets.tiny_imagenet import prepare_tiny_imagenet

    root = write_tiny_imagenet(tmp)  # the original layout
    prepare_tiny_imagenet(root, progress=False)  # regroups val/ by class
    return root


def _fixture(name: str) -> Callable[..., Path]:
    return lambda tmp, request: request.getfixturevalue(name)


# recipe -> (data folder for `--data`, extra overrides). A new recipe must be added here (a test checks).
DATA: dict[str, tuple[Callable[..., Path], list[str]]] = {
    "inception_v3/tiny_imagenet": (lambda tmp, req: _tiny_imagenet(tmp), INCEPTION_75),
    # The fast recipe keeps the aux head, which needs 299 px crops: dropped here to train at 75 px; its
    # head-only epochs need a trained body (a random one is refused as a probe of random features).
    "inception_v3/tiny_imagenet_fast": (lambda tmp, req: _tiny_imagenet(tmp),
                                        [*INCEPTION_75, "model.aux_loss_weight=null", "finetune.freeze_epochs=0"]),
    "inception_v3/imagefolder": (lambda tmp, req: make_image_folder(tmp / "folder"), INCEPTION_75),  # "your data"
    "demo/digits": (lambda tmp, req: tmp / "digits", []),  # scikit-learn's digits, written on first use
    "cifar10/small_cnn": (_fixture("cifar_root"), []),  # original pickle batches
    "fashion_mnist/mlp": (_fixture("fashion_root"), ["data.download=false"]),  # idx .gz files
    "mnist/mlp": (_fixture("fashion_root"), ["data.download=false"]),  # MNIST's files have the same names and format
    "imdb/text_classifier": (_fixture("imdb_root"), ["data.download=false"]),  # aclImdb/ reviews
}
# Recipes with no training run: the pretrained model they evaluate is exported instead (random
# weights, seed 0: there are no ImageNet weight files here, and shapes do not depend on values).
PRETRAINED = {"inception_v3/imagenet_eval": "inception_v3"}
RECIPES = [name for name, _ in list_recipes()]
# Inception v3 cases: its ONNX export and parity take 1-3 minutes each on 2 shared cores.
SLOW = {"inception_v3/tiny_imagenet", "inception_v3/tiny_imagenet_fast", "inception_v3/imagefolder", "inception_v3/imagenet_eval", "demo/digits"}
# The graph an export traces is the network in eval mode: dropout is the identity there and the aux head is
# never exported, so these recipes' runs trace the graph of the run exported for them (Inception v3, 25-35 s
# of torch.export each on the 2-core AMD EPYC Zen 3). They train here and must build that same network.
EXPORTED_AS = {"inception_v3/tiny_imagenet": "inception_v3/imagefolder",
               "inception_v3/tiny_imagenet_fast": "inception_v3/imagefolder",
               "demo/digits": "inception_v3/imagefolder"}
EVAL_IDENTITY_KWARGS = {"dropout", "aux_logits", "init_weights"}


def traced_network(spec: ModelSpec) -> tuple:
    """What decides the exported graph apart from sizes and class count."""
    kwargs = {k: v for k, v in spec.arch_kwargs.items() if k not in EVAL_IDENTITY_KWARGS}
    return spec.arch, spec.input_kind, spec.channels, spec.task, sorted(kwargs.items())


# Each recipe exported for another traces this network, checked after its training.
INCEPTION_V3 = ("inception_v3", "image", 3, "multiclass", [("transform_input", False)])


def test_every_shipped_recipe_has_a_case_here():
    assert sorted(RECIPES) == sorted([*DATA, *PRETRAINED])
    assert set(EXPORTED_AS.values()) <= set(DATA) - set(EXPORTED_AS)  # each is exported by a case of its own


@pytest.fixture
def sample_images(monkeypatch, sample_photos):
    """Parity on the guide's real sample photos where ../shared/data has them, else on written JPEGs."""
    real = SHARED_DATA / "imagenet-sample" / "images"
    monkeypatch.setenv("INCEPTIONLAB_SAMPLE_IMAGES", str(real if real.is_dir() else sample_photos))


def train_tiny(cli, recipe: str, tmp: Path, request: pytest.FixtureRequest) -> Path:
    make_data, extra = DATA[recipe]
    data = make_data(tmp, request)
    sets = [x for s in [*TINY, *extra] for x in ("--set", s)]
    result = cli("train", recipe, "--data", data, "--out", tmp / "runs", "--no-progress", "--json", *sets)
    assert result.code == 0, result.err
    return Path(json.loads(result.out.strip().splitlines()[-1])["run_dir"])


def check_export_and_bench(cli, target: list, spec: ModelSpec, home: Path) -> None:
    exported = cli("export", *target, "--json")
    assert exported.code == 0, exported.err
    meta = json.loads(Path(json.loads(exported.out)["sidecar"]).read_text())
    assert meta["parity"]["ok"] and meta["input"]["shape"] == ["batch", *spec.input_shape]
    assert meta["preprocessing"]["channels"] == spec.channels
    benched = cli("bench", *target, *BENCH_ONE)
    assert benched.code == 0, benched.err
    row = json.loads(benched.out.strip().splitlines()[0])
    assert row["backend"] == "eager" and row["p50_ms"] > 0
    recorded = json.loads((home / "bench" / "results.jsonl").read_text().splitlines()[-1])
    assert recorded["input_shape"] == list(spec.input_shape)


@pytest.mark.parametrize("recipe", [pytest.param(r, marks=pytest.mark.slow) if r in SLOW else r for r in RECIPES])
def test_recipe_run_exports_and_benchmarks(recipe, tmp_path, cli, request, sample_images):
    if recipe in PRETRAINED:
        name = PRETRAINED[recipe]
        from inceptionlab.models.registry import pretrained_spec

        check_export_and_bench(cli, ["--model", name, "--weights", "random", "--out", tmp_path / "exports"],
                               pretrained_spec(name), tmp_path / "exports" / name)
        return
    run = train_tiny(cli, recipe, tmp_path, request)
    spec = ModelSpec.load(run / "spec.json")
    if spec.input_kind == "tokens":
        # Text runs: a one-line refusal pointing at the torch.export package training wrote.
        for command in (["export", run], ["bench", run, *BENCH_ONE]):
            refused = cli(*command)
            assert refused.code == 2 and "takes tokens, not images" in refused.err
            assert str(run / "exports" / "text") in refused.err and len(refused.err.strip().splitlines()) == 1
        assert (run / "exports" / "text" / "model.pt2").is_file()
        return
    if recipe in EXPORTED_AS:
        assert traced_network(spec) == INCEPTION_V3, f"{recipe} no longer traces {EXPORTED_AS[recipe]}'s graph"
        return
    if spec.arch == "inception_v3":
        assert traced_network(spec) == INCEPTION_V3
    check_export_and_bench(cli, [run], spec, run)
