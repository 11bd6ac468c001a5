"""Grad-CAM's cost per image against a plain forward pass, for `predict --explain`, `report` and `serve --explain`.

For each batch size: a plain forward (torch.inference_mode, eager fp32: what `predict` runs), Grad-CAM
of a given class (judge/explain.py: Captum's LayerGradCam at the registry's layer, upsampled and scaled:
a forward with the layer hooked and a backward to it), Grad-CAM of the model's top class (a forward to
pick it first, as `serve --explain` does), and drawing the overlay as a PNG. The configurations
alternate round by round (A, B, C, A, B, C, ...) so drift on a shared machine falls on all of them
alike; each figure is the median of the rounds, in ms per image, and `gradcam_x` is Grad-CAM's time over
the plain forward's. Random weights (seed 0): the time does not depend on the values.

    python benchmarks/explain.py                                  # Inception v3 at 299 px, batches 1 and 8
    python benchmarks/explain.py --model resnet50 --size 224 --batches 1,8,32 --rounds 7
    python benchmarks/explain.py --device cuda
    python benchmarks/explain.py --model cifar10_cnn --size 32 --rounds 2 --warmup 1   # a smoke run
"""

from __future__ import annotations

import argparse
import io
import statistics
import time

import torch

from _results import write_result  # this folder's sibling module
from inceptionlab.engine.task import main_logits
from inceptionlab.judge.explain import Explainer, overlay
from inceptionlab.models.registry import build_model, drop_aux_heads
from inceptionlab.models.spec import ModelSpec


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    _sync(device)
    started = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - started


def configurations(explainer: Explainer, batch: torch.Tensor, classes: list[int]) -> dict:
    model, normalize, device = explainer.model, explainer.normalize, explainer.device

    def forward() -> None:
        with torch.inference_mode():
            main_logits(model(normalize(batch.to(device)))).float().softmax(dim=1).cpu()

    def gradcam() -> None:
        explainer.maps(batch, classes)

    def gradcam_top() -> None:
        top = explainer.answers(batch).index.tolist()
        explainer.maps(batch, top)

    cams = explainer.maps(batch, classes)

    def png() -> None:
        for image, cam in zip(batch, cams):
            overlay(image, cam).save(io.BytesIO(), format="PNG")

    return {"forward": forward, "gradcam": gradcam, "gradcam_top": gradcam_top, "overlay_png": png}


def measure(explainer: Explainer, size: int, batch_size: int, rounds: int, warmup: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    batch = torch.randint(0, 256, (batch_size, explainer.spec.channels, size, size), dtype=torch.uint8,
                          generator=generator)
    classes = [i % explainer.spec.num_classes for i in range(batch_size)]
    configs = configurations(explainer, batch, classes)
    for _ in range(warmup):
        for fn in configs.values():
            fn()
    seconds: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(rounds):  # interleaved: drift falls on every configuration alike
        for name, fn in configs.items():
            seconds[name].append(timed(fn, explainer.device))
    per_image = {name: statistics.median(values) * 1e3 / batch_size for name, values in seconds.items()}
    spread = {name: (max(v) - min(v)) / statistics.median(v) for name, v in seconds.items()}
    return {"batch": batch_size, **{f"{k}_ms": round(v, 3) for k, v in per_image.items()},
            "gradcam_x": round(per_image["gradcam"] / per_image["forward"], 2),
            "gradcam_top_x": round(per_image["gradcam_top"] / per_image["forward"], 2),
            "max_spread": round(max(spread.values()), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="inception_v3")
    parser.add_argument("--size", type=int, default=299, help="input side, px")
    parser.add_argument("--batches", default="1,8", help="comma list of batch sizes")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = build_model(args.model, 1000 if args.model not in ("cifar10_cnn",) else 10, None).model
    drop_aux_heads(model)
    classes = 1000 if args.model != "cifar10_cnn" else 10
    spec = ModelSpec(arch=args.model, num_classes=classes, class_names=[str(i) for i in range(classes)],
                     crop_size=args.size, resize_size=args.size)
    explainer = Explainer(model, spec, device)
    rows = []
    for batch_size in (int(b) for b in args.batches.split(",")):
        row = {"model": args.model, "size": args.size, "layer": explainer.layer, "threads": torch.get_num_threads(),
               **measure(explainer, args.size, batch_size, args.rounds, args.warmup)}
        print(row, flush=True)
        rows.append(row)
    write_result("explain", rows, title="Grad-CAM per image against a plain forward (ms per image, median of rounds)",
                 columns=[("model", "model"), ("size", "px"), ("layer", "layer"), ("batch", "batch"),
                          ("forward_ms", "forward ms", ".1f"), ("gradcam_ms", "Grad-CAM ms", ".1f"),
                          ("gradcam_top_ms", "+ top class ms", ".1f"), ("overlay_png_ms", "PNG ms", ".1f"),
                          ("gradcam_x", "Grad-CAM / forward", ".2f"), ("max_spread", "spread", ".2f")],
                 settings=vars(args), device=str(device))


if __name__ == "__main__":
    main()
