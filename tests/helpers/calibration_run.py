"""The small trained image run (helpers.small_runs) to calibrate, and images of none of its classes.

Its validation split has two images filed under the wrong class (a red "cat" square under dog/, ...):
the model calls them by their colour with high confidence, so validation has errors to calibrate
against (a split the model gets all right would push the temperature towards 0). The out-of-class
images are uniform noise and grey squares: colours of none of the classes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from helpers.small_runs import SETTINGS, copy_run_dir, small_run
from PIL import Image

from inceptionlab.models.spec import ModelSpec

__all__ = ["SETTINGS", "CalibrationRun", "calibration_run", "evaluate_json", "spec_of", "write_outside_images"]


@dataclass(frozen=True)
class CalibrationRun:
    run_dir: Path
    data: Path
    outside: Path  # images of none of the classes

    def copy(self, into: Path) -> "CalibrationRun":
        """A private copy of the run directory (evaluate writes spec.json and eval/ into it)."""
        return CalibrationRun(copy_run_dir(self.run_dir, into), self.data, self.outside)


_OUTSIDE: dict[str, Path] = {}


def write_outside_images(folder: Path, count: int = 12, seed: int = 1) -> Path:
    """Uniform noise and flat grey squares, 40 px like the training images."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    for i in range(count):
        Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(folder / f"noise_{i}.png")
        Image.fromarray(np.full((40, 40, 3), 60 + 12 * i, np.uint8)).save(folder / f"grey_{i}.png")
    return folder


def calibration_run(tmp_path_factory) -> CalibrationRun:
    """cifar10_cnn on 3 coloured classes (10 train, 6 val images each, 2 of val misfiled), trained once
    per session (the same run as `small_run`), and 24 images of no class."""
    run = small_run(tmp_path_factory)
    if "outside" not in _OUTSIDE:
        _OUTSIDE["outside"] = write_outside_images(tmp_path_factory.mktemp("outside") / "outside")
    return CalibrationRun(run.run_dir, run.data, _OUTSIDE["outside"])


def evaluate_json(cli, *args) -> dict:
    """`evaluate ARGS --json`'s report, the command having succeeded."""
    result = cli("evaluate", *args, "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


def spec_of(run: CalibrationRun) -> ModelSpec:
    return ModelSpec.load(run.run_dir / "spec.json")
