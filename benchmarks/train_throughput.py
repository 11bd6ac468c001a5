"""Training throughput of Inception v3 at 299 px, batch 16: the guide's plain loop vs this engine's fastest.

Prints images/s per configuration, measured in one run on the same machine (timings here swing
~15% between runs, so compare rows of one run only). Each configuration: warm-up steps (oneDNN
kernel creation, torch.compile), then timed steps with the device synchronised.

    python benchmarks/train_throughput.py [--steps 6] [--warmup 3] [--configs plain,bf16_cl,bf16_cl_compile] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from _results import write_result  # this folder's sibling module
from inceptionlab.models.spec import Normalize
from inceptionlab.engine.loop import StepSettings, train_step
from inceptionlab.engine.task import make_task
from inceptionlab.models.registry import build_model

CONFIGS = {
    # name: (precision, channels_last, compile)
    "plain": ("fp32", False, False),  # the guide's loop: fp32, NCHW, eager
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


def measure(name: str, batch: int, size: int, steps: int, warmup: int) -> dict:
    precision, channels_last, compile_ = CONFIGS[name]
    torch.manual_seed(0)
    model = build_model("inception_v3", num_classes=200, weights=None).model.train()
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    images_u8 = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8)
    targets = torch.randint(0, 200, (batch,))
    device = torch.device("cpu")
    if name == "plain":
        images = (images_u8.float() / 255 - 0.45) / 0.225

        def step():
            guide_step(model, optimizer, images, targets)
    else:
        runner = torch.compile(model) if compile_ else model
        settings = StepSettings(device, precision, Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225], channels_last))
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        task = make_task("multiclass", 200)

        def step():
            inputs, t = settings.to_device(images_u8, targets)
            train_step(runner, task, optimizer, scaler, settings, inputs, t)

    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    for _ in range(warmup - 1):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    mean = sum(times) / len(times)
    return {"config": name, "precision": precision, "channels_last": channels_last, "compile": compile_,
            "batch": batch, "size": size, "first_step_s": round(first, 2), "mean_step_s": round(mean, 3),
            "min_step_s": round(min(times), 3), "img_per_s": round(batch / mean, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--size", type=int, default=299)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--configs", default="plain,bf16_cl,bf16_cl_compile")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    print(f"# Inception v3 training step, {args.size} px, batch {args.batch}", flush=True)
    rows = []
    for name in args.configs.split(","):
        row = measure(name, args.batch, args.size, args.steps, args.warmup)
        rows.append(row)
        print(json.dumps(row) if args.json else
              f"{name:<17} {row['img_per_s']:7.2f} img/s  (step {row['mean_step_s']:.3f}s, min {row['min_step_s']:.3f}s, "
              f"first {row['first_step_s']:.1f}s)", flush=True)
    base = rows[0]["img_per_s"]
    for row in rows:
        row["vs_first"] = round(row["img_per_s"] / base, 2)
    for row in rows[1:]:
        print(f"# {row['config']}: {row['vs_first']:.2f}x the {rows[0]['config']} loop")
    write_result("train_throughput", rows, settings=vars(args),
                 title=f"Inception v3 training step, {args.size} px, batch {args.batch}",
                 columns=[("config", "configuration"), ("precision", "precision"), ("channels_last", "channels_last"),
                          ("compile", "compile"), ("img_per_s", "img/s (mean step)", ".2f"),
                          ("min_step_s", "best step s", ".3f"), ("first_step_s", "first step s", ".1f"),
                          ("vs_first", f"vs {rows[0]['config']}", ".2f")])


if __name__ == "__main__":
    main()
