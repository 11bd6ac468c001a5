"""A small trained image run with planted label errors, for the per-image results, the error report,
Grad-CAM, label-error and score-calibration tests.

The guide's CIFAR-10 network (cifar10_cnn, 62 k parameters, 32 px) learns the coloured squares of
`make_image_folder` in a few epochs: ~30 s with start-up on the shared 2-core machine, against
resnet18's 30-190 s. Its validation split holds images whose folder is wrong (a red "cat" square filed
under dog/, ...): the model, trained on train/ only, calls them by their colour with high confidence,
so they are both misclassified and the label errors a confident-learning check must find.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from conftest import FAST, make_image_folder

CLASSES = ("cat", "dog", "fox")
# (source class, folder it is filed under): the planted label errors of the validation split.
PLANTED = (("cat", "dog"), ("fox", "cat"))
SETTINGS = [s for s in FAST if not s.startswith(("data.train_crop", "data.val_", "optim.lr", "train.epochs"))] + [
    "model.name=cifar10_cnn", "data.train_crop_size=32", "data.val_resize_size=32", "data.val_crop_size=32",
    "train.epochs=6", "optim.lr=0.01",
]


@dataclass(frozen=True)
class SmallRun:
    run_dir: Path
    data: Path
    planted: list[Path]  # the mislabelled validation files, as they lie in val/

    def copy(self, into: Path) -> "SmallRun":
        """A private copy of the run directory (commands write eval/ and report files into it)."""
        return SmallRun(copy_run_dir(self.run_dir, into), self.data, self.planted)


def copy_run_dir(run_dir: Path, into: Path) -> Path:
    """run_dir copied into `into`, without its checkpoints and TensorBoard logs."""
    target = into / run_dir.name
    shutil.copytree(run_dir, target, ignore=shutil.ignore_patterns("checkpoints", "tb"))
    return target


_CACHE: dict[str, SmallRun] = {}


def plant_label_errors(data: Path) -> list[Path]:
    """Move one validation image of each PLANTED source class into the wrong class folder."""
    planted = []
    for source, wrong in PLANTED:
        image = sorted((data / "val" / source).glob("*.png"))[0]
        target = data / "val" / wrong / f"planted_{image.name}"
        image.rename(target)
        planted.append(target)
    return planted


def small_run(tmp_path_factory) -> SmallRun:
    """cifar10_cnn trained on 3 coloured classes (10 train, 6 val images each, 2 of val mislabelled),
    trained once per test session."""
    from inceptionlab.config import load_recipe
    from inceptionlab.engine.fit import fit

    if "run" not in _CACHE:
        root = tmp_path_factory.mktemp("small_run")
        data = make_image_folder(root / "data", classes=CLASSES, train_per_class=10, val_per_class=6)
        planted = plant_label_errors(data)
        recipe = load_recipe("inception_v3/imagefolder", [*SETTINGS, f"data.root={data}"])
        _CACHE["run"] = SmallRun(fit(recipe, root / "runs", progress=False).run_dir, data, planted)
    return _CACHE["run"]
