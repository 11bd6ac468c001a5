"""`inceptionlab doctor`'s "speed settings on this machine": what `auto` picks here, and why.

For each device and three workloads (the demo's training step, the fine-tuning recipe's step, and
serving Inception v3 one image at a time), the decision `train`/`serve`/`bench` would take: from the
speed cache when a run already measured it, else from the probe alone (`doctor --calibrate` measures
afresh, ~20 s per training workload and ~10 s for inference on a 2-core CPU).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from inceptionlab import hardware
from inceptionlab.engine.choices import load_training_recipe
from inceptionlab.engine.speed import RunShape, decide_training
from inceptionlab.engine.task import make_task
from inceptionlab.infer.speed import decide_inference
from inceptionlab.models.registry import build_model


@dataclass(frozen=True)
class Workload:
    label: str
    purpose: str  # train | infer
    recipe: str | None  # a training recipe, or None for inference
    size: int = 299
    batch: int = 1


WORKLOADS = (
    Workload("train demo/digits", "train", "demo/digits"),
    Workload("train inception_v3/tiny_imagenet_fast", "train", "inception_v3/tiny_imagenet_fast"),
    Workload("serve inception_v3, 299 px, batch 1", "infer", None, 299, 1),
)


@dataclass
class SpeedRow:
    device: str
    workload: str
    decision: hardware.Decision

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "workload": self.workload, **self.decision.to_dict()}


def speed_settings(devices: list[str], calibrate: bool = False,
                   cache: hardware.SpeedCache | None = None) -> list[SpeedRow]:
    """One row per device and workload; measures only with `calibrate` (then afresh)."""
    rows = []
    for name in devices:
        device = torch.device(name)
        for workload in WORKLOADS:
            rows.append(SpeedRow(name, workload.label, _decide(workload, device, calibrate, cache)))
    return rows


def _decide(workload: Workload, device: torch.device, calibrate: bool,
            cache: hardware.SpeedCache | None) -> hardware.Decision:
    if workload.purpose == "infer":
        return _inference(workload, device, calibrate, cache)
    return _training(workload, device, calibrate, cache)


def _training(workload: Workload, device: torch.device, calibrate: bool,
              cache: hardware.SpeedCache | None) -> hardware.Decision:
    recipe = load_training_recipe(workload.recipe, ["model.weights=null"])
    classes = 10 if recipe.data.reader == "digits" else 200
    data = recipe.data
    built = build_model(recipe.model.name, classes, None, recipe.model.aux_loss_weight, **recipe.model.kwargs)
    task = make_task(recipe.task, classes, recipe.train.label_smoothing, recipe.model.aux_loss_weight)
    shape = RunShape((3, data.train_crop_size, data.train_crop_size), False, classes)
    with threads_of_a_run():
        return decide_training(recipe, built.model, task, device, shape, hardware.device_facts(device),
                               fresh=calibrate, measure=calibrate, cache=cache)


def _inference(workload: Workload, device: torch.device, calibrate: bool,
               cache: hardware.SpeedCache | None) -> hardware.Decision:
    built = build_model("inception_v3", 1000, None, None)
    with threads_of_a_run():
        return decide_inference(built.model, "inception_v3", (3, workload.size, workload.size), workload.batch,
                                device, measure=calibrate, fresh=calibrate, cache=cache)


class threads_of_a_run:
    """The thread count a run would start with (the cache is keyed by it), restored afterwards."""

    def __enter__(self) -> None:
        self.saved = torch.get_num_threads()
        limit, _ = hardware.thread_limit(None, os.environ)
        torch.set_num_threads(limit)

    def __exit__(self, *exc: Any) -> None:
        torch.set_num_threads(self.saved)


def format_rows(rows: list[SpeedRow]) -> list[str]:
    """The table doctor prints: device, workload, choice, how it was decided and the evidence."""
    lines = ["speed settings on this machine (what `auto` picks; `doctor --calibrate` measures afresh):"]
    for row in rows:
        lines.append(f"  {row.device:<7} {row.workload:<40} {row.decision.summary()}")
    return lines
