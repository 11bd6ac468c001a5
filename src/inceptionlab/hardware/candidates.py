"""Speed candidates: a precision, a memory format and torch.compile; what the user wants (a value or
`auto`) and which candidates the probe leaves for `auto` to choose among."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from inceptionlab.hardware.facts import DeviceFacts, no_bf16_reason

AUTO = "auto"
# INCEPTIONLAB_AUTO=safe: `auto` means fp32, NCHW, eager without probing or timing (figures comparable
# across machines; the test suite runs so). Unset or `measure`: probe and calibrate.
AUTO_ENV = "INCEPTIONLAB_AUTO"


@dataclass(frozen=True)
class Candidate:
    """One speed configuration: a precision, a memory format and whether to torch.compile."""

    precision: str = "fp32"
    channels_last: bool = False
    compile: bool = False

    @property
    def label(self) -> str:
        parts = [self.precision, "channels_last" if self.channels_last else "nchw"]
        return " ".join(parts + (["compile"] if self.compile else []))

    @classmethod
    def from_label(cls, label: str) -> Candidate:
        parts = label.split()
        return cls(parts[0], parts[1] == "channels_last", "compile" in parts[2:])


SAFE = Candidate()


@dataclass(frozen=True)
class Wanted:
    """What the user asked for: a fixed value per dimension, or AUTO."""

    precision: str = AUTO
    channels_last: bool | str = AUTO
    compile: bool | str = AUTO


def precision_options(facts: DeviceFacts, training: bool) -> tuple[list[str], dict[str, str]]:
    """(precisions worth measuring, {precision: why not}) for this device."""
    options, ruled_out = ["fp32"], {}
    if facts.bf16:
        options.append("bf16")
    else:
        ruled_out["bf16"] = no_bf16_reason(facts)
    if facts.kind == "cpu":
        pass  # fp16 autocast on a CPU pays only on AMX-FP16 parts, for inference: never an auto candidate
    elif facts.fp16 and not (facts.bf16 and training):
        # Where bf16 exists it is preferred for training: fp32's range, no loss scaling.
        options.append("fp16")
    elif not facts.fp16:
        ruled_out["fp16"] = "; ".join(facts.notes) or f"{facts.arch} has no fp16 matrix units"
    return options, ruled_out


def layout_options(facts: DeviceFacts, env: Mapping[str, str]) -> tuple[list[bool], str | None]:
    """(memory formats worth measuring, a reason when one is forced or dropped)."""
    if facts.kind == "rocm":
        suggested = env.get("PYTORCH_MIOPEN_SUGGEST_NHWC")
        if suggested is not None:  # the user's own MIOpen setting decides the layout
            on = suggested.strip().lower() in ("1", "true", "yes", "on")
            return [on], f"PYTORCH_MIOPEN_SUGGEST_NHWC={suggested} set by the user"
    return [False, True], None


def compile_options(facts: DeviceFacts, training: bool) -> tuple[list[bool], str]:
    """torch.compile is decided by the probe alone, never timed: timing it would cost its own compile
    (tens of seconds to minutes for Inception v3, each candidate again), far above the calibration's
    bound, and under torchrun the other ranks would wait that long in their first collective.

    Off on CPUs (inductor's CPU training kernels gained nothing over oneDNN in our runs and the
    compile takes minutes on 2 cores), off on ROCm (can be slower than eager: pytorch/pytorch#187065),
    on NVIDIA GPUs from sm_70 for long runs only (`long_run`, decided by the caller).
    """
    if facts.kind == "cuda" and facts.fp16:
        return [False, True], "torch.compile pays on NVIDIA GPUs when the run is long enough to amortise the compile"
    if facts.kind == "rocm":
        return [False], "torch.compile can be slower than eager on ROCm (pytorch/pytorch#187065)"
    return [False], "torch.compile costs minutes on a CPU and oneDNN's eager kernels are as fast"


def compile_dynamic_batch(facts: DeviceFacts) -> tuple[bool, str]:
    """(compile inference with the batch dimension dynamic, why): one graph for batch 1 and one for every
    larger batch, or one static graph per batch size (a server's buckets 1, 2, 4, ... 32: six compiles of
    the model, each a recompile that counts toward dynamo's limit).

    Dynamic everywhere, measured on a CPU (benchmarks/compile_batch.py, the CIFAR-10 CNN at 32 px,
    buckets 1-32, fp32, 1 thread, the two modes alternated over 4 rounds on a shared 2-core AMD EPYC,
    2026-11-26): compiling took 94 s for the dynamic graphs against 169 s for six static ones, and the
    per-batch latencies were within the machine's noise (static/dynamic 0.81-1.23, no consistent
    winner). GPUs are not measured yet: Inductor specialises GPU kernels to a static shape, so where the
    same script shows static rows at least 10% faster at the served batches, the GPU row belongs here.
    """
    if facts.is_gpu:
        return True, "dynamic batch: one compile for every bucket size (GPUs: not measured against static yet)"
    return True, "dynamic batch: 1.8x less compile time than a graph per bucket, latency within noise (AMD EPYC)"


def plan_candidates(facts: DeviceFacts, wanted: Wanted, *, training: bool, long_run: bool = False,
                    env: Mapping[str, str] | None = None) -> tuple[list[Candidate], dict[str, str]]:
    """Every candidate the probe allows for the AUTO dimensions (fixed ones pinned); SAFE-like first.

    Returns (candidates, {what: why it was ruled out or forced}).
    """
    if auto_is_safe(env):
        return [_safe_for(wanted)], {"auto": f"{AUTO_ENV}=safe: fp32, NCHW, eager wherever not set"}
    env = os.environ if env is None else env
    reasons: dict[str, str] = {}
    if wanted.precision == AUTO:
        precisions, ruled_out = precision_options(facts, training)
        reasons.update(ruled_out)
    else:
        precisions = [wanted.precision]
    if wanted.channels_last == AUTO:
        layouts, why = layout_options(facts, env)
        if why:
            reasons["layout"] = why
    else:
        layouts = [bool(wanted.channels_last)]
    if wanted.compile == AUTO:
        compiles, why = compile_options(facts, training)
        compiled = long_run and True in compiles
        if not long_run and True in compiles:
            why = "torch.compile: the run is too short to amortise the compile"
        reasons["compile"] = why
    else:
        compiled = bool(wanted.compile)
    # One compile value for every candidate: the probe's (or the user's). The calibration times them
    # eager and the choice carries it (calibration.decide).
    candidates = [Candidate(p, cl, compiled) for p in precisions for cl in layouts]
    return candidates, reasons


def auto_is_safe(env: Mapping[str, str] | None = None) -> bool:
    """INCEPTIONLAB_AUTO=safe: `auto` is fp32, NCHW, eager, one serving instance; nothing is timed."""
    return (os.environ if env is None else env).get(AUTO_ENV, "").strip().lower() == "safe"


def _safe_for(wanted: Wanted) -> Candidate:
    pick = lambda value, safe: safe if value == AUTO else value  # noqa: E731
    return Candidate(pick(wanted.precision, "fp32"), bool(pick(wanted.channels_last, False)),
                     bool(pick(wanted.compile, False)))


def baseline_of(candidates: list[Candidate]) -> Candidate:
    """The safe candidate among these: fp32, NCHW, eager where allowed, else the first."""
    ranked = sorted(candidates, key=lambda c: (c.precision != "fp32", c.channels_last, c.compile))
    return ranked[0]
