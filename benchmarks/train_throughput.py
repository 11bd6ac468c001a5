"""Training throughput of Inception v3 at 299 px, batch 16: the guide's plain loop, each speed setting,
and what `auto` picks on this machine, on the CPU or a GPU (`--device cuda`).

Prints images/s per configuration, measured in one run on the same machine (timings here swing
~15% between runs, so compare rows of one run only). Each configuration: warm-up steps (oneDNN
kernel creation, torch.compile), then timed steps with the device synchronised. The `auto` row is
decided afresh by the same code `inceptionlab train` runs (engine/speed.py: probe, then a timed
calibration within 20 s), then timed like the others: it should be within a few percent of the best
row and never below `fp32` (fp32, NCHW, eager). Precisions this machine can only emulate (bf16 on a
CPU without bf16 units) are skipped unless named in --configs.

The batch is made once, on the device: the figures are the step's ceiling, with no loader in the way
(`make gpu-report` puts them beside the end-to-end ones). On a GPU every step is synchronised, and each
engine configuration runs under the per-run GPU settings of `inceptionlab train` (hardware.gpu_settings:
cuDNN's autotuner on NVIDIA, TF32 for fp32 on sm_80+); the guide's `plain` loop under torch's defaults.

    python benchmarks/train_throughput.py [--steps 6] [--warmup 3] [--configs plain,fp32,cl,bf16,bf16_cl,auto]
        [--device cpu|cuda] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from _results import write_result  # this folder's sibling module
from inceptionlab.models.spec import Normalize
from inceptionlab.engine.loop import StepSettings, train_step
from inceptionlab.engine.task import make_task
from inceptionlab.host import keep_freed_memory
from inceptionlab.models.registry import build_model

CONFIGS = {
    # name: (precision, channels_last, compile)
    "plain": ("fp32", False, False),  # the guide's loop, verbatim: fp32, NCHW, eager
    "fp32": ("fp32", False, False),  # the engine's step with the safe settings
    "cl": ("fp32", True, False),
    "bf16": ("bf16", False, False),
    "bf16_cl": ("bf16", True, False),
    "bf16_cl_compile": ("bf16", True, True),
}


def guide_step(model, optimizer, images, targets):
    """The guide's step, verbatim: output, loss, zero_grad, backward, step."""
    output = model(images)
    loss = F.cross_entropy(output, targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def measure(name: str, batch: int, size: int, steps: int, warmup: int, setting: tuple | None = None,
            device: torch.device = torch.device("cpu")) -> dict:
    from inceptionlab import hardware

    precision, channels_last, compile_ = setting or CONFIGS[name]
    torch.manual_seed(0)
    model = build_model("inception_v3", num_classes=200, weights=None).model.train()
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(device=device, memory_format=fmt)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    images_u8 = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8).to(device)
    targets = torch.randint(0, 200, (batch,)).to(device)
    if name == "plain":
        images = (images_u8.float() / 255 - 0.45) / 0.225

        def step():
            guide_step(model, optimizer, images, targets)
    else:
        runner = torch.compile(model) if compile_ else model
        settings = StepSettings(device, precision, Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225], channels_last))
        # fp16 trains with loss scaling, as `inceptionlab train` does (engine/session.py)
        scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        task = make_task("multiclass", 200)

        def step():
            inputs, t = settings.to_device(images_u8, targets)
            train_step(runner, task, optimizer, scaler, settings, inputs, t)

    def timed_step() -> float:
        began = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # a GPU step is done when its kernels are, not when they are queued
        return time.perf_counter() - began

    # The guide's loop runs with torch's defaults; the engine's rows with the settings a run gets.
    gpu = contextlib.nullcontext() if name == "plain" else hardware.gpu_settings(hardware.device_facts(device), precision)
    with gpu:
        first = timed_step()
        for _ in range(warmup - 1):
            timed_step()
        times = [timed_step() for _ in range(steps)]
    mean = sum(times) / len(times)
    return {"config": name, "precision": precision, "channels_last": channels_last, "compile": compile_,
            "batch": batch, "size": size, "first_step_s": round(first, 2), "mean_step_s": round(mean, 3),
            "min_step_s": round(min(times), 3), "img_per_s": round(batch / mean, 2)}


def decide_auto(batch: int, size: int, device: torch.device = torch.device("cpu")) -> tuple[tuple, dict]:
    """What `inceptionlab train` decides here for this model, size and batch, measured afresh."""
    import tempfile

    from inceptionlab import hardware
    from inceptionlab.config import load_recipe
    from inceptionlab.engine.speed import RunShape, decide_training

    recipe = load_recipe("inception_v3/tiny_imagenet", ["train.precision=auto", "train.channels_last=auto",
                                                          "train.compile=auto", f"train.batch_size={batch}",
                                                          f"data.train_crop_size={size}"])
    torch.manual_seed(0)
    model = build_model("inception_v3", num_classes=200, weights=None).model
    with tempfile.TemporaryDirectory() as cache:
        decision = decide_training(recipe, model, make_task("multiclass", 200), device,
                                   RunShape((3, size, size), False, 200, steps=100),
                                   hardware.device_facts(device), fresh=True, cache=hardware.SpeedCache(Path(cache)))
    choice = decision.choice
    print(f"# auto: {decision.line('decision')}", flush=True)
    return (choice.precision, choice.channels_last, choice.compile), decision.to_dict()


def runnable(names: list[str], asked: bool, device: torch.device = torch.device("cpu")) -> list[str]:
    """Drop precisions this device can only emulate, unless the user named the configurations."""
    from inceptionlab import hardware

    facts = hardware.device_facts(device)
    if asked or facts.bf16:
        return names
    kept = [n for n in names if n == "auto" or CONFIGS[n][0] != "bf16"]
    for name in sorted(set(names) - set(kept)):
        print(f"# skipped {name}: {hardware.emulation_warning(facts, 'bf16', measure=False)}", flush=True)
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--size", type=int, default=299)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--configs", default=None, help="comma list of " + ", ".join([*CONFIGS, "auto"]))
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (a ROCm GPU is cuda too)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    keep_freed_memory()  # the heap `inceptionlab train` runs on
    from inceptionlab.runtime import resolve_device

    device = resolve_device(args.device)
    print(f"# Inception v3 training step, {args.size} px, batch {args.batch}, {device}", flush=True)
    names = runnable((args.configs or "plain,fp32,cl,bf16,bf16_cl,auto").split(","), asked=args.configs is not None,
                     device=device)
    rows, decision = [], None
    for name in names:
        setting = None
        if name == "auto":
            setting, decision = decide_auto(args.batch, args.size, device)
        row = measure(name, args.batch, args.size, args.steps, args.warmup, setting, device)
        rows.append(row)
        print(json.dumps(row) if args.json else
              f"{name:<17} {row['img_per_s']:7.2f} img/s  (step {row['mean_step_s']:.3f}s, min {row['min_step_s']:.3f}s, "
              f"first {row['first_step_s']:.1f}s)", flush=True)
    base = rows[0]["img_per_s"]
    for row in rows:
        row["vs_first"] = round(row["img_per_s"] / base, 2)
    for row in rows[1:]:
        print(f"# {row['config']}: {row['vs_first']:.2f}x the {rows[0]['config']} loop")
    auto_row = next((row for row in rows if row["config"] == "auto"), None)
    if auto_row is not None:
        best = max((row for row in rows if row["config"] not in ("auto", "plain")), key=lambda row: row["img_per_s"])
        auto_row["vs_best"] = round(auto_row["img_per_s"] / best["img_per_s"], 3)
        print(f"# auto chose {auto_row['precision']} channels_last={auto_row['channels_last']}: "
              f"{auto_row['vs_best']:.2f}x the best row ({best['config']})")
    write_result("train_throughput", rows, settings=vars(args), details={"auto_decision": decision}, device=str(device),
                 title=f"Inception v3 training step, {args.size} px, batch {args.batch}, synthetic data on the device",
                 columns=[("config", "configuration"), ("precision", "precision"), ("channels_last", "channels_last"),
                          ("compile", "compile"), ("img_per_s", "img/s (mean step)", ".2f"),
                          ("min_step_s", "best step s", ".3f"), ("first_step_s", "first step s", ".1f"),
                          ("vs_first", f"vs {rows[0]['config']}", ".2f"), ("vs_best", "auto vs best", ".2f")])


if __name__ == "__main__":
    main()
