"""Run under torchrun (2 processes, gloo): one accumulated step with class weights on a session's DDP model.

    torchrun --standalone --nproc_per_node=2 tests/helpers/ddp_weighted_step.py OUT IMAGES

Each rank builds the training session of `cifar10_cnn` with class weights [1, 10, 1], plain SGD and
micro-batches of 2, and steps once on its half of one fixed, skewed 12-sample batch (rank 0: six images of
class 1, weight 10; rank 1: two of class 1 and four of the others). Writes OUT/rank<R>.pt: the weights
before and after the step and each parameter's learning rate, for the test to compare with the whole
batch's step in one process.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from inceptionlab.config import load_recipe
from inceptionlab.engine.distributed import shutdown_distributed
from inceptionlab.engine.loop import train_step
from inceptionlab.engine.session import build_training_session

CLASS_WEIGHTS = [1.0, 10.0, 1.0]
SETS = ["model.name=cifar10_cnn", "model.weights=null", "finetune.body_lr_mult=1", "data.train_crop_size=32", "data.val_resize_size=32",
        "data.val_crop_size=32", "data.num_workers=0", "train.batch_size=6", "train.micro_batch_size=2",
        "train.precision=fp32", "train.channels_last=false", "train.compile=false", "train.threads=1",
        "train.label_smoothing=0.1", f"train.class_weights={CLASS_WEIGHTS}", "optim.name=sgd", "optim.lr=0.5",
        "optim.momentum=0", "optim.weight_decay=0", "schedule.name=constant"]
LABELS = torch.tensor([1, 1, 1, 1, 1, 1, 1, 1, 0, 2, 0, 2])


def the_batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(12, 3, 32, 32, generator=torch.Generator().manual_seed(1)), LABELS


def main() -> None:
    out, images = Path(sys.argv[1]), Path(sys.argv[2])
    rank = int(os.environ["RANK"])
    s = build_training_session(load_recipe("inception_v3/imagefolder", [*SETS, f"data.root={images}"]))
    runner = s.wrap(s.model)  # the whole model's stage wrapper, as fit builds it
    assert s.settings.micro_batch == 2 and runner is not s.model  # accumulated, DDP-wrapped
    inputs, targets = the_batch()
    mine = slice(6 * rank, 6 * rank + 6)
    before = {k: v.detach().clone() for k, v in s.model.state_dict().items()}
    lr_of = {id(p): group["lr"] for group in s.optimizer.param_groups for p in group["params"]}
    runner.train()
    train_step(runner, s.task, s.optimizer, s.scaler, s.settings, inputs[mine], targets[mine])
    torch.save({"before": before, "after": s.model.state_dict(),
                "lr": {name: lr_of[id(p)] for name, p in s.model.named_parameters()}}, out / f"rank{rank}.pt")
    shutdown_distributed()


if __name__ == "__main__":
    main()
