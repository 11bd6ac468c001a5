"""Run under torchrun (2 processes, gloo): rank 1's loss turns NaN mid-interval, rank 0's stays finite.

    torchrun --standalone --nproc_per_node=2 tests/helpers/ddp_nonfinite.py OUT

Each rank trains a tiny model (no DDP: rank 0's parameters never see rank 1's NaN) through the loop
with the agreement `fit` uses, and writes OUT/rank<R>.txt: the NonFiniteLoss message it stopped with,
or "finished". A rank that stopped alone would leave the other blocked in its next collective; the
process group's 60 s timeout turns that into a failure instead of a hang.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from inceptionlab.config import OptimConfig
from inceptionlab.engine.distributed import agree_at_log, init_distributed
from inceptionlab.engine.loop import NonFiniteLoss, StepSettings, train_one_epoch
from inceptionlab.engine.optim import build_optimizer
from inceptionlab.engine.task import MulticlassTask


def batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(rank)
    out = [(torch.randn(4, 5, generator=generator), torch.randint(0, 3, (4,), generator=generator)) for _ in range(12)]
    if rank == 1:
        out[6][0][0, 0] = float("nan")  # step 7: in the interval that ends at step 8
    return out


def main(out: Path) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    info = init_distributed("cpu")
    device = torch.device("cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    optimizer = build_optimizer(model.parameters(), OptimConfig(name="sgd", lr=0.01))
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    settings = StepSettings(device, log_every=4)
    try:
        train_one_epoch(model, batches(info.rank), MulticlassTask(3), optimizer, scaler, settings,
                        agree=lambda loss: agree_at_log(loss, False, info, device))
        outcome = "finished"
    except NonFiniteLoss as exc:
        outcome = str(exc)
    (out / f"rank{info.rank}.txt").write_text(outcome)
    dist.barrier()  # both ranks reach here only if they stopped at the same point
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
