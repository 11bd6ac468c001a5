"""What EMA and each augmentation cost per training step, beside a 299 px Inception v3 step (fp32).

The target (issue 26): EMA plus MixUp/CutMix under 5% of the step. Rows, each timed in the same
process, interleaved round by round with the step itself (one round: every row once), so a change of
load on the machine touches them all alike; the median over rounds, and its share of the step's median:
- `step`: one training step of Inception v3 (forward, loss, backward, SGD) on a batch on the device;
- `ema`: one update of an exponential moving average of its weights and buffers: the project's
  `engine/ema.py` when it exists (`--ema project`), else torch's `swa_utils.AveragedModel` with
  `get_ema_multi_avg_fn`, the primitive that module is built on (`--ema swa_utils`);
- `mixup`, `cutmix`: `BatchMix` (data/transforms/mixing.py) on the normalised batch, soft targets included;
- `ema+mix`: ema plus the dearer of mixup and cutmix (the target's row);
- `device crop`, `device crop+<policy>`, `device crop+erasing`: the resident/stream path's batch
  transform from `--source` px uint8 images (tiny-imagenet: 64) to the training size; `<policy>` rows'
  share is their difference to `device crop` (what the policy adds to the step);
- `worker <policy>`: torchvision's transform on each uint8 crop, one image at a time, x batch: CPU time
  the DataLoader workers spend per step (in parallel with the step, not on its path while they keep up).

    python benchmarks/augment_cost.py [--batch 32] [--size 299] [--source 64] [--rounds 5]
        [--policies trivialaugment,randaugment,autoaugment] [--ema auto|project|swa_utils] [--device cpu|cuda] [--json]

Smoke run (seconds): --size 75 --batch 2 --source 32 --rounds 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import torch

from _results import write_result  # this folder's sibling module
from inceptionlab.config import AugmentConfig
from inceptionlab.data.transforms.device import DeviceAugment
from inceptionlab.data.transforms.device_policy import PolicyAugment
from inceptionlab.data.transforms.mixing import BatchMix
from inceptionlab.data.transforms.policies import batch_policy, torchvision_policy
from inceptionlab.engine.loop import StepSettings, train_step
from inceptionlab.engine.task import make_task
from inceptionlab.host import keep_freed_memory
from inceptionlab.models.registry import build_model

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CLASSES = 200
EMA_DECAY = 0.9998  # timm's ModelEmaV3 default; the cost does not depend on it


def project_ema(model: torch.nn.Module) -> Callable[[], None] | None:
    """One update of the project's EMA (engine/ema.py: `ModelEma(model, EmaConfig)`), or None where this
    tree has none yet."""
    try:
        from inceptionlab.config import EmaConfig
        from inceptionlab.engine.ema import ModelEma
    except ImportError:
        return None
    averaged = ModelEma(model, EmaConfig(decay=EMA_DECAY))
    averaged.update(model)  # the first update copies; the rest average, as every later step does
    return lambda: averaged.update(model)


def swa_utils_ema(model: torch.nn.Module) -> Callable[[], None]:
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    averaged = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(EMA_DECAY), use_buffers=True)
    return lambda: averaged.update_parameters(model)


def ema_update(model: torch.nn.Module, which: str) -> tuple[Callable[[], None], str]:
    if which in ("auto", "project"):
        update = project_ema(model)
        if update is not None:
            return update, "engine/ema.py"
        if which == "project":
            raise SystemExit("--ema project: this tree has no inceptionlab.engine.ema.ModelEma")
    return swa_utils_ema(model), "swa_utils.AveragedModel (stand-in)"


def synced(device: torch.device, work: Callable[[], object]) -> Callable[[], float]:
    def timed() -> float:
        began = time.perf_counter()
        work()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - began

    return timed


def worker_cost(policy: str, size: int, batch: int, erasing: float) -> Callable[[], object]:
    """torchvision's per-image transform over `batch` uint8 crops, one after another (what the workers do)."""
    from torchvision.transforms import v2

    cfg = AugmentConfig(policy=policy, random_erasing=erasing)
    steps = [t for t in (torchvision_policy(cfg),) if t is not None]
    if erasing:
        steps.append(v2.RandomErasing(p=erasing, value=[124.0, 116.0, 104.0]))
    transform = v2.Compose(steps)
    crops = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8)
    return lambda: [transform(crops[k]) for k in range(batch)]


def rows_to_time(args: argparse.Namespace, device: torch.device) -> tuple[dict[str, Callable[[], float]], str]:
    torch.manual_seed(0)
    model = build_model("inception_v3", num_classes=CLASSES, weights=None).model.train().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    task = make_task("multiclass", CLASSES)
    settings = StepSettings(device, "fp32")
    scaler = torch.amp.GradScaler(device.type, enabled=False)
    batch = torch.randn(args.batch, 3, args.size, args.size, device=device)
    targets = torch.randint(0, CLASSES, (args.batch,), device=device)
    ema, ema_source = ema_update(model, args.ema)
    mixup = BatchMix(CLASSES, mixup_alpha=0.2, seed=1)
    cutmix = BatchMix(CLASSES, cutmix_alpha=1.0, seed=1)
    counter = iter(range(10**9))
    sources = torch.randint(0, 256, (args.batch, 3, args.source, args.source), dtype=torch.uint8, device=device)
    sizes = torch.full((args.batch,), args.source, device=device)
    crop = DeviceAugment(args.size, MEAN, STD, hflip=True)
    generator = torch.Generator(device=device)

    def device_call(augment: Callable) -> Callable[[], object]:
        def call() -> object:
            generator.manual_seed(next(counter))  # a new batch's draws each time, as the loaders seed them
            return augment(sources, sizes, sizes, generator)
        return call

    timed = {
        "step": synced(device, lambda: train_step(model, task, optimizer, scaler, settings, batch, targets)),
        "ema": synced(device, ema),
        "mixup": synced(device, lambda: mixup(batch, targets, 0, next(counter))),
        "cutmix": synced(device, lambda: cutmix(batch, targets, 0, next(counter))),
        "device crop": synced(device, device_call(crop)),
    }
    for policy in args.policies:
        timed[f"device crop+{policy}"] = synced(device, device_call(PolicyAugment(crop, batch_policy(AugmentConfig(policy=policy)))))
    timed["device crop+erasing"] = synced(device, device_call(PolicyAugment(crop, None, 0.25)))
    for policy in args.policies:
        timed[f"worker {policy}"] = synced(device, worker_cost(policy, args.size, args.batch, 0.0))
    timed["worker erasing"] = synced(device, worker_cost("none", args.size, args.batch, 0.25))
    return timed, ema_source


def measure(timed: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Every row once per round (after one warm-up call each): interleaved, so load changes hit all rows."""
    for call in timed.values():
        call()
    seconds: dict[str, list[float]] = {name: [] for name in timed}
    for round_ in range(rounds):
        for name, call in timed.items():
            seconds[name].append(call())
        print(f"# round {round_ + 1}/{rounds}: step {seconds['step'][-1]:.3f} s", flush=True)
    return seconds


def summarise(seconds: dict[str, list[float]]) -> list[dict]:
    median = {name: statistics.median(values) for name, values in seconds.items()}
    step = median["step"]
    rows = []
    for name, values in seconds.items():
        added = median[name] - median["device crop"] if name.startswith("device crop+") else median[name]
        rows.append({"row": name, "median_ms": round(median[name] * 1e3, 2), "min_ms": round(min(values) * 1e3, 2),
                     "added_ms": round(added * 1e3, 2), "share_of_step_pct": round(100 * added / step, 2)})
    mix = max(median["mixup"], median["cutmix"])
    both = median["ema"] + mix
    rows.append({"row": "ema+mix", "median_ms": round(both * 1e3, 2), "min_ms": None, "added_ms": round(both * 1e3, 2),
                 "share_of_step_pct": round(100 * both / step, 2), "target_pct": 5.0,
                 "within_target": 100 * both / step < 5.0})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=299)
    parser.add_argument("--source", type=int, default=64, help="device rows: the cached images' size, px")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--policies", default="trivialaugment,randaugment,autoaugment",
                        type=lambda text: [p for p in text.split(",") if p])
    parser.add_argument("--ema", choices=("auto", "project", "swa_utils"), default="auto")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (a ROCm GPU is cuda too)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    keep_freed_memory()  # the heap every `inceptionlab` command runs on
    from inceptionlab.runtime import resolve_device

    device = resolve_device(args.device)
    print(f"# Inception v3 step, {args.size} px, batch {args.batch}, fp32, {device}; {args.rounds} rounds", flush=True)
    timed, ema_source = rows_to_time(args, device)
    rows = summarise(measure(timed, args.rounds))
    for row in rows:
        print(json.dumps(row) if args.json else
              f"{row['row']:<28} {row['median_ms']:10.2f} ms  adds {row['added_ms']:9.2f} ms  "
              f"{row['share_of_step_pct']:6.2f}% of the step", flush=True)
    target = rows[-1]
    print(f"# EMA ({ema_source}) + MixUp/CutMix: {target['share_of_step_pct']:.2f}% of the step "
          f"({'within' if target['within_target'] else 'over'} the 5% target)", flush=True)
    write_result("augment_cost", rows, settings={**vars(args), "ema_source": ema_source}, device=str(device),
                 title=f"EMA and augmentation per step beside Inception v3 at {args.size} px, batch {args.batch}, fp32",
                 columns=[("row", "row"), ("median_ms", "median ms", ".2f"), ("added_ms", "adds ms", ".2f"),
                          ("share_of_step_pct", "% of the step", ".2f")])


if __name__ == "__main__":
    main()
