"""Run under torchrun (2 processes, gloo): a fine-tuning run whose stages change mid-run, and what each
rank ends with.

    torchrun --standalone --nproc_per_node=2 tests/helpers/ddp_finetune_record.py OUT IMAGES WEIGHTS

resnet18 (BatchNorm) from a weights file on an image folder: epoch 0 scores them, epochs 1-2 train the head
on cached features (the head alone
in a DDP wrapper), epoch 3 the whole model (a new DDP wrapper), with EMA, a balanced sampler, class
weights (listed: automatic ones on a balanced sampler are refused) and two accumulated micro-batches per step. Writes OUT/rank<R>.json: sha256 of the rank's trained weights and of its average, how many
splits this rank pushed through the body for the feature cache, and how many barriers it entered.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed

import inceptionlab.engine.features as features_module
import inceptionlab.engine.fit as fit_module
from inceptionlab.config import load_recipe
from inceptionlab.engine.distributed import shutdown_distributed
from inceptionlab.engine.session import build_training_session

SETS = ["model.name=resnet18", "data.train_crop_size=32", "data.val_resize_size=32",
        "data.val_crop_size=32", "data.num_workers=0", "train.batch_size=4", "train.micro_batch_size=2",
        "train.epochs=3", "train.log_every=1", "optim.lr=0.02", "finetune.freeze_epochs=2", "finetune.body_lr_mult=1", "ema.decay=0.7",
        # Frozen statistics: batch statistics of 2 images a rank wrecked the running ones at the unfreeze
        # (validation loss 1.10 -> 1277, a run stopped as diverged, also at lr 0.005).
        "finetune.bn=frozen",
        "data.sampler=balanced", "train.class_weights=[1.0,2.0,0.5]"]


def digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for key, value in sorted(state.items()):
        h.update(key.encode())
        h.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def counted(module, name: str) -> list[int]:
    """Replace module.name by a wrapper that counts its calls (in the returned list)."""
    calls: list[int] = []
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    setattr(module, name, wrapper)
    return calls


def main() -> None:
    out, images, weights = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    rank = int(os.environ["RANK"])
    recipe = load_recipe("inception_v3/imagefolder", [*SETS, f"data.root={images}", f"model.weights={weights}"])
    extracted, barriers = counted(features_module, "extract"), counted(torch.distributed, "barrier")
    s = build_training_session(recipe)
    outcome = fit_module._fit(s, recipe, out / "runs", None, False, None, None)
    record = {"model": digest(s.model.state_dict()), "ema": digest(s.ema.module.state_dict()),
              "run_dir": str(outcome.run_dir), "status": outcome.status, "extracted": len(extracted),
              "barriers": len(barriers)}
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    shutdown_distributed()


if __name__ == "__main__":
    main()
