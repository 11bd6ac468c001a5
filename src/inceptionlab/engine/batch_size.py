"""`train.batch_size=auto` and `train.micro_batch_size=auto`: the largest batch that fits this GPU.

Found by probing, as Lightning's batch-size finder and ultralytics' AutoBatch do, on a private copy of
the run's model (the run's weights, optimizer and RNG streams are untouched): one training step
(forward, loss, backward, optimizer step) on synthetic inputs of the run's shape at batch 2, 4, 8, ...
until a step runs out of memory or needs more than the budget, then a bisection between the last batch
that fitted and the first that did not. The budget is the device's free memory before probing, less
`HEADROOM` (10%): the allocator's fragmentation, the data loader's pinned buffers and evaluation's
larger batches need room the probe does not see; and less what the run will place on the device after
probing and the probe's step does not hold (`reserved`, from the session builder): the resident data
cache, the weights' average (EMA) and DistributedDataParallel's gradient buckets. A batch of 16 or more is rounded down to a multiple
of 8 (tensor-core tiles). The result is cached with the speed settings (hardware.SpeedCache, keyed by
GPU, torch, model, input shape, precision, memory format, compile and optimizer) and printed with its
evidence: the peak memory of each probed batch.

The learning rate follows the batch by the linear scaling rule (Goyal et al. 2017): optim.lr is meant
for optim.lr_batch_size images per step (null: 32), and the run uses lr x batch / lr_batch_size. A
found micro-batch changes no rate: the step still sees train.batch_size images (gradient accumulation).

On a CPU memory does not bound the batch (host RAM is large and the step's time grows with it), so
`auto` takes optim.lr_batch_size and no micro-batching.
"""

from __future__ import annotations

import copy
import gc
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
from torch import nn

from inceptionlab import hardware
from inceptionlab.config import Recipe
from inceptionlab.engine.loop import StepSettings, train_step
from inceptionlab.engine.optim import build_optimizer
from inceptionlab.engine.speed import RunShape, synthetic_batch
from inceptionlab.errors import UserError

HEADROOM = 0.10
MAX_BATCH = 4096  # probing stops here: beyond it the step's time, not memory, is the limit
DEFAULT_LR_BATCH = 32
TILE = 8


@dataclass
class BatchProbe:
    """What probing found: the chosen batch and its evidence."""

    chosen: int
    fits: int  # the largest batch that ran within the budget
    fails: int | None  # the smallest that ran out of memory or over the budget (None: none did, up to MAX_BATCH)
    budget_bytes: int
    peaks: dict[int, int | None] = field(default_factory=dict)  # batch -> peak bytes of its step (None: OOM)
    source: str = "measured"  # measured | cached
    reserved: dict[str, int] = field(default_factory=dict)  # what the budget leaves free for -> bytes

    def evidence(self) -> str:
        shown = ", ".join(f"{b}: {'out of memory' if p is None else f'{p / 2**30:.2f} GiB'}"
                          for b, p in sorted(self.peaks.items()))
        over = f", {self.fails} does not" if self.fails else f" (probing stops at {MAX_BATCH})"
        kept = {what: size for what, size in self.reserved.items() if size}
        less = (" and " + ", ".join(f"{size / 2**30:.2f} GiB for {what}" for what, size in kept.items())
                if kept else "")
        return (f"{self.chosen} ({self.source}: {self.fits} fits in {self.budget_bytes / 2**30:.1f} GiB, the free "
                f"memory less {HEADROOM:.0%}{less}{over}; peak per step {shown})")

    def to_figures(self) -> dict[str, float]:
        figures = {"chosen": float(self.chosen), "fits": float(self.fits), "budget": float(self.budget_bytes),
                   "fails": float(self.fails or 0)}
        figures.update({f"peak_{b}": float(-1 if p is None else p) for b, p in self.peaks.items()})
        figures.update({f"reserved_{what}": float(size) for what, size in self.reserved.items()})
        return figures

    @classmethod
    def from_figures(cls, figures: dict[str, float]) -> BatchProbe:
        peaks = {int(k[5:]): (None if v < 0 else int(v)) for k, v in figures.items() if k.startswith("peak_")}
        reserved = {k[9:]: int(v) for k, v in figures.items() if k.startswith("reserved_")}
        return cls(int(figures["chosen"]), int(figures["fits"]), int(figures["fails"]) or None,
                   int(figures["budget"]), peaks, "cached", reserved)


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def find_batch(step_peak: Callable[[int], int], budget_bytes: int, *, start: int = 2,
               limit: int = MAX_BATCH) -> BatchProbe:
    """The largest batch whose step's peak memory stays within `budget_bytes`.

    `step_peak(batch)` runs one step and returns its peak bytes, or raises an out-of-memory error."""
    peaks: dict[int, int | None] = {}

    def fits(batch: int) -> bool:
        try:
            peaks[batch] = step_peak(batch)
        except Exception as exc:  # only running out of memory is an answer; anything else is a failure
            if not is_out_of_memory(exc):
                raise
            peaks[batch] = None
            return False
        return peaks[batch] <= budget_bytes

    good, bad = 0, None
    batch = max(1, start)
    while batch <= limit:
        if not fits(batch):
            bad = batch
            break
        good, batch = batch, batch * 2
    if good == 0:
        good = 1 if batch > 1 and fits(1) else 0
        if good == 0:
            return BatchProbe(0, 0, bad, budget_bytes, peaks)
    while bad is not None and bad - good > max(1, good // 16):  # within ~6% of the limit: enough
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    chosen = good - good % TILE if good >= 2 * TILE else good
    return BatchProbe(chosen, good, bad, budget_bytes, peaks)


def cuda_step_peak(recipe: Recipe, model: nn.Module, task: Any, device: torch.device, shape: RunShape) -> Callable[[int], int]:
    """One training step of a private copy of `model` at a batch size -> its peak bytes above the start."""
    def step_peak(batch: int) -> int:
        memory_format = torch.channels_last if recipe.train.channels_last else torch.contiguous_format
        gc.collect()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        copied = runner = optimizer = inputs = targets = None
        try:
            copied = copy.deepcopy(model).to(device=device, memory_format=memory_format).train()
            runner = torch.compile(copied) if recipe.train.compile else copied
            optimizer = build_optimizer(copied.parameters(), recipe.optim)
            scaler = torch.amp.GradScaler(device.type, enabled=recipe.train.precision == "fp16")
            inputs, targets = synthetic_batch(shape, batch, device, recipe.task)
            if inputs.dim() == 4:
                inputs = inputs.contiguous(memory_format=memory_format)
            for _ in range(2):  # the second step holds the optimizer's state too
                train_step(runner, task, optimizer, scaler, StepSettings(device, recipe.train.precision), inputs, targets)
            torch.cuda.synchronize(device)
            return torch.cuda.max_memory_allocated(device) - before
        finally:
            del copied, runner, optimizer, inputs, targets
            gc.collect()
            torch.cuda.empty_cache()

    return step_peak


def probe_cuda(recipe: Recipe, model: nn.Module, task: Any, device: torch.device, shape: RunShape,
               cache: hardware.SpeedCache | None = None, reserved: dict[str, int] | None = None) -> BatchProbe:
    """The batch that fits in the free memory less HEADROOM and less `reserved` (what -> bytes the run places
    on the device after probing: its data cache, EMA copy, DDP buckets)."""
    reserved = dict(reserved or {})
    facts = hardware.device_facts(device)
    key = hardware.make_key("batch", facts, recipe.model.name, shape.input_shape, 0,
                            extra=f"{recipe.task}/{recipe.optim.name}/{recipe.train.precision}/"
                                  f"cl={recipe.train.channels_last}/compile={recipe.train.compile}/"
                                  f"aux={recipe.model.aux_loss_weight is not None}/headroom={HEADROOM}/"
                                  f"reserved_mib={sum(reserved.values()) // 2**20}")
    cache = cache or hardware.SpeedCache()
    figures = cache.load(key)
    if "chosen" in figures:
        return BatchProbe.from_figures(figures)
    free, _ = torch.cuda.mem_get_info(device)
    with torch.random.fork_rng(devices=[device]):
        probe = find_batch(cuda_step_peak(recipe, model, task, device, shape), budget_bytes(free, reserved))
    probe.reserved = reserved
    cache.store(key, probe.to_figures())
    return probe


def budget_bytes(free: int, reserved: dict[str, int]) -> int:
    """What one training step may use: the free memory less HEADROOM, less what the run keeps beside it."""
    return max(0, int(free * (1 - HEADROOM)) - sum(reserved.values()))


def resolve_batch_sizes(recipe: Recipe, model: nn.Module, task: Any, device: torch.device, shape: RunShape, *,
                        broadcast: Callable[[Any], Any] = lambda value: value,
                        probe: Callable[..., BatchProbe] | None = None,
                        reserved: Callable[[], dict[str, int]] | None = None) -> tuple[Recipe, list[str]]:
    """The recipe with `auto` batch sizes replaced (and optim.lr scaled for a found batch); lines to print.

    Under DDP rank 0 probes and every rank takes its answer (`broadcast`). `reserved`: what the run will
    keep on the device beside a step (asked only when probing: estimating a data cache reads headers)."""
    train = recipe.train
    if "auto" not in (train.batch_size, train.micro_batch_size):
        return recipe, []
    reference = recipe.optim.lr_batch_size or DEFAULT_LR_BATCH
    found: BatchProbe | None = None
    if device.type == "cuda":
        found = broadcast((probe or probe_cuda)(recipe, model, task, device, shape, None,
                                                (reserved or dict)()))
        if found.chosen < 1:
            raise_no_fit(recipe, found)
    notes: list[str] = []
    batch = train.batch_size
    if batch == "auto":
        batch = found.chosen if found else reference
        lr = recipe.optim.lr * batch / reference
        where = f"found on this GPU: {found.evidence()}" if found else "a CPU: memory does not bound it"
        notes.append(f"batch size: {batch} ({where}); lr {recipe.optim.lr:g} x {batch}/{reference} = {lr:g} "
                     f"(linear scaling from optim.lr_batch_size={reference})")
        recipe = replace(recipe, optim=replace(recipe.optim, lr=lr))
    micro = train.micro_batch_size
    if micro == "auto":
        micro = None if found is None else largest_divisor(batch, found.chosen)
        notes.append(f"micro-batch: {micro or batch}" + (f" ({batch // micro} accumulated per step; "
                     f"found on this GPU: {found.evidence()})" if micro and micro < batch else " (the whole batch)"))
    return replace(recipe, train=replace(train, batch_size=batch, micro_batch_size=micro)), notes


def largest_divisor(batch: int, at_most: int) -> int:
    """The largest divisor of `batch` not above `at_most` (micro-batches of equal size)."""
    return next(d for d in range(min(batch, max(1, at_most)), 0, -1) if batch % d == 0)


def raise_no_fit(recipe: Recipe, probe: BatchProbe) -> None:
    raise UserError(f"{recipe.model.name}: not even a batch of 1 fits in {probe.budget_bytes / 2**30:.1f} GiB of "
                    "free GPU memory; free the GPU, or try train.precision=bf16 / a smaller data.train_crop_size")
