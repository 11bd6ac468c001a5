"""`auto` precision and memory format for eager PyTorch inference (bench, serve, doctor).

inceptionlab.hardware rules candidates out by probe; this module times the rest as inference runs them: a
private copy of the model in eval mode, `torch.inference_mode`, autocast, at the batch that will be
served or benchmarked, warm-up excluded. Reduced precisions chosen here still face the agreement
rule (infer/quantize.py) wherever the caller applies it (serve, bench).
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn

from inceptionlab import hardware
from inceptionlab.runtime import autocast

# Forward-only calibration is cheaper than training's: a few forwards of Inception v3 at 299 px,
# batch 1, take ~0.2 s each in fp32 on 2 cores. 10 s covers four candidates.
INFERENCE_BUDGET_S = 10.0


def decide_inference(model: nn.Module, model_name: str, input_shape: tuple[int, ...], batch: int,
                     device: torch.device, wanted: hardware.Wanted = hardware.Wanted(compile=False), *,
                     measure: bool = True, fresh: bool = False,
                     cache: hardware.SpeedCache | None = None) -> hardware.Decision:
    """What eager inference of `model` should run in here (precision, memory format), with evidence."""
    facts = hardware.device_facts(device)
    candidates, reasons = hardware.plan_candidates(facts, hardware.Wanted(wanted.precision, wanted.channels_last,
                                                                          False), training=False)
    if len(input_shape) != 3:  # token ids: no convolution reads a memory format
        candidates = [c for c in candidates if not c.channels_last] or candidates
    key = hardware.make_key("infer", facts, model_name, input_shape, batch, extra="eager")
    timer = _forward_measure(model, input_shape, batch, device, facts) if measure else None
    return hardware.decide(candidates, timer, key=key, cache=cache or hardware.SpeedCache(), fresh=fresh,
                           budget_s=INFERENCE_BUDGET_S, ruled_out=reasons)


def _forward_measure(model: nn.Module, input_shape: tuple[int, ...], batch: int, device: torch.device,
                     facts: hardware.DeviceFacts) -> hardware.Measure:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(batch, *input_shape, generator=generator).to(device)

    def measure(candidate: hardware.Candidate, seconds: float) -> float | None:
        with hardware.gpu_settings(facts, candidate.precision):  # as bench and serve will run it
            return hardware.time_steps(forward_step(model, inputs, device, candidate), batch, seconds)

    return measure


def forward_step(model: nn.Module, inputs: torch.Tensor, device: torch.device,
                 candidate: hardware.Candidate) -> Callable[[], None]:
    memory_format = torch.channels_last if candidate.channels_last else torch.contiguous_format
    copied = copy.deepcopy(model).to(device=device, memory_format=memory_format).eval()
    batch = inputs.contiguous(memory_format=memory_format) if inputs.dim() == 4 else inputs

    def step() -> None:
        with torch.inference_mode(), autocast(device, candidate.precision):
            copied(batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return step
