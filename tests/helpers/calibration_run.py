"""A small trained image run to calibrate, and images of none of its classes.

The guide's CIFAR-10 network (cifar10_cnn, 62 k parameters, 32 px) learns the coloured squares of
`make_image_folder` in a few epochs (~35 s with start-up on the shared 2-core machine). Two validation
images are filed under the wrong class (a red "cat" square under dog/, ...): the model calls them by
their colour with high confidence, so validation has errors to calibrate against (a split the model
gets all right would push the temperature towards 0). The out-of-class images are uniform noise and
grey squares: colours of none of the classes.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from conftest import FAST, make_image_folder
from PIL import Image

CLASSES = ("cat", "dog", "fox")
MISFILED = (("cat", "dog"), ("fox", "cat"))  # (class of the image, folder it is filed under)
SETTINGS = [s for s in FAST if not s.startswith(("data.train_crop", "data.val_", "optim.lr", "train.epochs"))] + [
    "model.name=cifar10_cnn", "data.train_crop_size=32", "data.val_resize_size=32", "data.val_crop_size=32",
    "train.epochs=6", "optim.lr=0.01",
]


@dataclass(frozen=True)
class CalibrationRun:
    run_dir: Path
    data: Path
    outside: Path  # images of none of the classes

    def copy(self, into: Path) -> "CalibrationRun":
        """A private copy of the run directory (evaluate writes spec.json and eval/ into it)."""
        target = into / self.run_dir.name
        shutil.copytree(self.run_dir, target, ignore=shutil.ignore_patterns("checkpoints", "tb"))
        return CalibrationRun(target, self.data, self.outside)


_CACHE: dict[str, CalibrationRun] = {}


def write_outside_images(folder: Path, count: int = 12, seed: int = 1) -> Path:
    """Uniform noise and flat grey squares, 40 px like the training images."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    for i in range(count):
        Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(folder / f"noise_{i}.png")
        Image.fromarray(np.full((40, 40, 3), 60 + 12 * i, np.uint8)).save(folder / f"grey_{i}.png")
    return folder


def calibration_run(tmp_path_factory) -> CalibrationRun:
    """cifar10_cnn on 3 coloured classes (10 train, 6 val images each, 2 of val misfiled), once per session."""
    from inceptionlab.config import load_recipe
    from inceptionlab.engine.fit import fit

    if "run" not in _CACHE:
        root = tmp_path_factory.mktemp("calibration_run")
        data = make_image_folder(root / "data", classes=CLASSES, train_per_class=10, val_per_class=6)
        for source, wrong in MISFILED:
            image = sorted((data / "val" / source).glob("*.png"))[0]
            image.rename(data / "val" / wrong / f"misfiled_{image.name}")
        recipe = load_recipe("inception_v3/imagefolder", [*SETTINGS, f"data.root={data}"])
        run_dir = fit(recipe, root / "runs", progress=False).run_dir
        _CACHE["run"] = CalibrationRun(run_dir, data, write_outside_images(root / "outside"))
    return _CACHE["run"]
