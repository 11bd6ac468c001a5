"""Run under torchrun (2 processes, gloo): what each rank's random number streams draw, in a run
trained straight through and in the same run stopped mid-epoch and resumed.

    torchrun --standalone --nproc_per_node=2 tests/helpers/ddp_rng_record.py OUT IMAGES TEXTS

For two recipes: image folders with host-side augmentation (random crops and flips drawn in this
process: data.loader=workers, num_workers=0) and the IMDB text classifier (dropout). Every training
forward records fingerprints of the global RNG state, of the input batch (the augmentation) and of
each dropout mask. Writes OUT/rank<R>.json: {recipe: {"straight": [...], "stopped": [...],
"resumed": [...]}}, each a list of [what, fingerprint].
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import inceptionlab.engine.fit as fit_module
from inceptionlab.config import load_recipe
from inceptionlab.engine.fit import StopSignal, fit
from inceptionlab.models.small import UniformMaskDropout

COMMON = ["train.epochs=2", "train.log_every=1", "train.batch_size=2", "data.num_workers=0", "optim.lr=0.01"]
RECIPES = {
    "images": ("inception_v3/imagefolder", ["model.name=cifar10_cnn", "model.weights=null", "finetune.body_lr_mult=1", "data.loader=workers",
                                            "data.train_crop_size=32", "data.val_resize_size=32",
                                            "data.val_crop_size=32"]),
    "text": ("imdb/text_classifier", ["data.download=false"]),
}
STOP_AT_STEP = 2  # of the first epoch: 4 or more steps per rank and epoch, so the stop is mid-epoch

draws: list[list[str]] = []


def fingerprint(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def record_input(module: torch.nn.Module, args: tuple) -> None:
    if module.training:
        draws.append(["rng", fingerprint(torch.get_rng_state())])
        draws.append(["input", fingerprint(args[0])])


def record_mask(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
    if module.training:
        draws.append(["mask", fingerprint(output == 0)])


def with_recorders(build):
    def build_and_hook(recipe):
        session = build(recipe)
        session.model.register_forward_pre_hook(record_input)
        for module in session.model.modules():
            if isinstance(module, (torch.nn.Dropout, UniformMaskDropout)):
                module.register_forward_hook(record_mask)
        return session

    return build_and_hook


def taken() -> list[list[str]]:
    copy = list(draws)
    draws.clear()
    return copy


def run_three_ways(name: str, overrides: list[str], out: Path) -> dict[str, list[list[str]]]:
    recipe = load_recipe(name, overrides)
    fit(recipe, out / "straight", progress=False)
    straight = taken()

    stop = StopSignal()
    epoch_starts = []

    def stop_mid_first_epoch(step: int, loss: float) -> None:
        if step == 1:
            epoch_starts.append(step)
        if step == STOP_AT_STEP and len(epoch_starts) == 1:
            stop.request()

    stopped_outcome = fit(recipe, out / "resumed", progress=False, stop=stop, on_log=stop_mid_first_epoch)
    assert stopped_outcome.status == "interrupted", stopped_outcome.status
    stopped = taken()
    run_dir = [str(stopped_outcome.run_dir)]
    dist.broadcast_object_list(run_dir, src=0)  # only rank 0 made (and knows) the run directory
    fit(recipe, out / "resumed", Path(run_dir[0]), progress=False)
    return {"straight": straight, "stopped": stopped, "resumed": taken()}


def main(out: Path, images: Path, texts: Path) -> None:
    fit_module.build_training_session = with_recorders(fit_module.build_training_session)
    roots = {"images": images, "text": texts}
    recorded = {}
    for key, (name, overrides) in RECIPES.items():
        recorded[key] = run_three_ways(name, [*COMMON, *overrides, f"data.root={roots[key]}"], out / key)
    rank = int(os.environ["RANK"])
    (out / f"rank{rank}.json").write_text(json.dumps(recorded))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*(Path(arg) for arg in sys.argv[1:4]))
