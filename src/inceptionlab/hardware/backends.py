"""Process-wide GPU settings: cuDNN's autotuner and TF32 (torch.backends flags), one setting per device
and precision, applied alike by every command that runs a model on a GPU (train and its calibration,
evaluate, bench, serve and the inference calibration), so eager rows are tuned as the engines they are
compared with, and recorded in the environment record (`record`).

TF32 is set through the per-operator `fp32_precision` API where torch has it (2.9 and later:
`torch.backends.cuda.matmul.fp32_precision`, `torch.backends.cudnn.conv/rnn.fp32_precision`, "tf32" or
"ieee"), the legacy `allow_tf32` flags otherwise: once the new API has been used (by the user, Inductor
or `doctor`'s kernel check), reading a legacy flag raises RuntimeError, so the two are never mixed here.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

from inceptionlab.hardware.facts import DeviceFacts

PRECISIONS = ("fp32", "bf16", "fp16")


def cudnn_benchmark(facts: DeviceFacts) -> bool:
    """cuDNN's autotuner on NVIDIA (fixed shapes); off on ROCm, where it makes MIOpen run an
    exhaustive search for every new shape (ROCm/pytorch#1851)."""
    return facts.kind == "cuda"


@dataclass(frozen=True)
class GpuSettings:
    """What a command sets on a GPU for one precision."""

    cudnn_benchmark: bool
    tf32: bool
    deterministic: bool = False


def settings_for(facts: DeviceFacts, precision: str, deterministic: bool = False) -> GpuSettings | None:
    """The one setting per device and precision; None on a CPU (nothing to set).

    TF32 for fp32 work on sm_80+ (10-bit mantissa in the matmul units, fp32 range): torch's default is
    IEEE fp32 for matmuls, which leaves Ampere's tensor cores idle; bf16/fp16 autocast runs its
    matmuls and convolutions in the reduced type and leaves TF32 off. Deterministic runs get neither
    the autotuner (its choice can differ between runs) nor TF32.
    """
    if not facts.is_gpu:
        return None
    return GpuSettings(cudnn_benchmark(facts) and not deterministic,
                       facts.tf32 and precision == "fp32" and not deterministic, deterministic)


def record(facts: DeviceFacts, deterministic: bool = False) -> dict[str, Any] | None:
    """The environment record's `gpu_settings`: the autotuner and TF32 per precision on this device."""
    if not facts.is_gpu:
        return None
    first = settings_for(facts, "fp32", deterministic)
    return {"cudnn_benchmark": first.cudnn_benchmark, "deterministic": deterministic,
            "tf32": {p: settings_for(facts, p, deterministic).tf32 for p in PRECISIONS},
            "tf32_api": "fp32_precision" if _has_fp32_precision_api() else "allow_tf32"}


@contextlib.contextmanager
def gpu_settings(facts: DeviceFacts, precision: str, deterministic: bool = False) -> Iterator[GpuSettings | None]:
    """`settings_for(facts, precision)` applied for what runs inside, the caller's flags restored after
    (they are process-wide); a no-op on a CPU."""
    settings = settings_for(facts, precision, deterministic)
    if settings is None:
        yield None
        return
    saved = _read()
    try:
        _write(settings.cudnn_benchmark, settings.deterministic, settings.tf32)
        yield settings
    finally:
        _restore(saved)


def apply_gpu_settings(facts: DeviceFacts, precision: str) -> GpuSettings | None:
    """`settings_for` set for the rest of the process (a server: its model runs until it exits)."""
    settings = settings_for(facts, precision)
    if settings is not None:
        _write(settings.cudnn_benchmark, settings.deterministic, settings.tf32)
    return settings


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """TF32 for convolutions and matmuls on or off for what runs inside (doctor's kernel check: off),
    the caller's settings restored after."""
    saved = _read()
    try:
        _write_tf32(enabled)
        yield
    finally:
        _restore(saved)


def _torch() -> Any:
    import torch  # start-up time: this package is imported before torch (the CLI sets MIOpen's variables first)

    return torch


def _has_fp32_precision_api() -> bool:
    torch = _torch()
    conv = getattr(torch.backends.cudnn, "conv", None)
    return conv is not None and hasattr(conv, "fp32_precision")


def _read() -> dict[str, Any]:
    torch = _torch()
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    flags: dict[str, Any] = {"benchmark": cudnn.benchmark, "deterministic": cudnn.deterministic}
    if _has_fp32_precision_api():
        flags["fp32_precision"] = (matmul.fp32_precision, cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision)
    else:
        flags["allow_tf32"] = (matmul.allow_tf32, cudnn.allow_tf32)
    return flags


def _write(benchmark: bool, deterministic: bool, tf32_on: bool) -> None:
    torch = _torch()
    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cudnn.deterministic = deterministic
    _write_tf32(tf32_on)


def _write_tf32(enabled: bool) -> None:
    torch = _torch()
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    if _has_fp32_precision_api():
        value = "tf32" if enabled else "ieee"
        matmul.fp32_precision = cudnn.conv.fp32_precision = cudnn.rnn.fp32_precision = value
    else:
        matmul.allow_tf32 = cudnn.allow_tf32 = enabled


def _restore(flags: dict[str, Any]) -> None:
    torch = _torch()
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    cudnn.benchmark, cudnn.deterministic = flags["benchmark"], flags["deterministic"]
    if "fp32_precision" in flags:
        matmul.fp32_precision, cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision = flags["fp32_precision"]
    else:
        matmul.allow_tf32, cudnn.allow_tf32 = flags["allow_tf32"]


def current() -> dict[str, Any]:
    """The flags as set now in this process (what a test or the GPU report reads back)."""
    flags = _read()
    return {"cudnn_benchmark": bool(flags["benchmark"]), "deterministic": bool(flags["deterministic"]),
            **({"fp32_precision": list(flags["fp32_precision"])} if "fp32_precision" in flags
               else {"allow_tf32": list(flags["allow_tf32"])})}
