"""torchrun / DistributedDataParallel set-up. Side effects (files, logs, plots) happen on rank 0 only.

Launch: `torchrun --nproc_per_node=NUM_GPUS -m inceptionlab train RECIPE ...` (add --nnodes and
--rdzv-endpoint for several nodes). NCCL (RCCL on ROCm) on GPUs, gloo on CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1  # processes on this node: they share its CPUs

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device_type: str) -> DistInfo:
    """Join the process group torchrun describes in the environment; a no-op for one process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), world_size, int(os.environ.get("LOCAL_RANK", "0")),
                    int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size))))
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend=backend)
    return info


def shutdown_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def agree_at_log(loss: float, stop: bool, info: DistInfo, device: torch.device) -> tuple[bool, list[float]]:
    """(a stop requested on any rank, every rank's interval loss in rank order): what the loop checks at
    a log point, where the host has just waited for the device anyway. One all-reduce carries both, so
    a NaN on one rank stops every rank at the same step (each rank fills its own slot; the sum of a
    NaN and zeros stays NaN) and a stop request costs no collective of its own."""
    if not info.enabled:
        return stop, [loss]
    values = [0.0] * (info.world_size + 1)
    values[0], values[1 + info.rank] = (1.0 if stop else 0.0), loss
    agreed = torch.tensor(values, dtype=torch.float64).to(device)
    dist.all_reduce(agreed)
    stop_sum, *losses = agreed.tolist()
    return stop_sum > 0, losses


def normaliser_over_ranks(task: Any, info: DistInfo) -> Callable[[torch.Tensor | float], torch.Tensor] | None:
    """What each rank divides its summed loss by so that DDP's average of the ranks' gradients is the
    gradient of the whole step's loss, sum over ranks of the summed losses / sum over ranks of the
    normalisers (engine/task.py): the ranks' mean normaliser, one all-reduce of a scalar per step.

    Only with class weights: then a rank's normaliser is the sum of its samples' weights, which differs
    between ranks (a skewed batch split 60 : 24 of weight), and each rank's own weighted mean, averaged,
    is not the batch's. Without them a normaliser is a rank's sample count, the same on every rank (the
    sampler gives each rank as many samples, its batches the same sizes), so DDP's mean is already exact
    and the step keeps its one collective. None: divide by the rank's own."""
    if not info.enabled or getattr(task, "class_weights", None) is None:
        return None

    def ranks_mean(normaliser: torch.Tensor | float) -> torch.Tensor:
        total = torch.as_tensor(normaliser, dtype=torch.float32).clone()
        dist.all_reduce(total)  # queued on the device's stream under NCCL: no host sync
        return total / info.world_size

    return ranks_mean


def gather_from_all(obj: Any, info: DistInfo) -> list[Any]:
    """Every rank's `obj` (picklable), in rank order, on every rank; `[obj]` in one process. A
    collective: every rank calls it at the same point (fit: where a checkpoint is written)."""
    if not info.enabled:
        return [obj]
    gathered: list[Any] = [None] * info.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def broadcast_state(module: torch.nn.Module, info: DistInfo) -> None:
    """Rank 0's parameters and buffers on every rank. DDP's constructor does this for the module it wraps;
    a stage that wraps only the head (engine/finetune.py) would leave each rank its own random body."""
    if not info.enabled:
        return
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor, src=0)


def broadcast_buffers(module: torch.nn.Module, info: DistInfo) -> None:
    """Rank 0's buffers on every rank, as DDP's broadcast_buffers does for the model it wraps. The weights'
    average needs it: each rank averages the BatchNorm statistics of its own batches, and rank 0's are
    the model's (DDP broadcasts them before each forward)."""
    if not info.enabled:
        return
    for buffer in module.buffers():
        dist.broadcast(buffer, src=0)
