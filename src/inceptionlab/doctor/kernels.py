"""The kernel check: a Conv2d forward+backward on each device, compared against a CPU reference."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from inceptionlab.doctor.report import one_line
from inceptionlab.hardware import backends

# fp32 device result vs CPU fp32 (and CPU fp32 vs fp64): a 3x3x3 conv accumulates 27 products
# per output, so honest fp32 kernels agree far inside this; TF32 (10-bit mantissa) or a broken
# kernel does not.
FP32_RTOL = 1e-3
FP32_ATOL = 1e-4


@dataclass(frozen=True)
class ConvCase:
    """Fixed inputs for the Conv2d forward+backward check (CPU tensors)."""

    weight: torch.Tensor
    bias: torch.Tensor
    inputs: torch.Tensor
    grad_output: torch.Tensor


@dataclass(frozen=True)
class ConvResult:
    output: torch.Tensor
    weight_grad: torch.Tensor
    bias_grad: torch.Tensor


@dataclass(frozen=True)
class Comparison:
    ok: bool
    max_abs_diff: float
    detail: str


def make_conv_case(seed: int = 0) -> ConvCase:
    """Batch 2, 3->8 channels, 16x16, 3x3 kernel; a private generator keeps global RNG untouched."""
    gen = torch.Generator().manual_seed(seed)
    return ConvCase(
        weight=torch.randn(8, 3, 3, 3, generator=gen) * 0.2,
        bias=torch.randn(8, generator=gen) * 0.1,
        inputs=torch.randn(2, 3, 16, 16, generator=gen),
        # A random upstream gradient (not ones) makes the weight gradient depend on every output.
        grad_output=torch.randn(2, 8, 16, 16, generator=gen),
    )


def run_conv(case: ConvCase, device: str | torch.device, dtype: torch.dtype = torch.float32) -> ConvResult:
    """Conv2d forward+backward on `device`; results come back as CPU tensors of `dtype`."""
    conv = torch.nn.Conv2d(3, 8, kernel_size=3, padding=1).to(device=device, dtype=dtype)
    with torch.no_grad():
        conv.weight.copy_(case.weight)
        conv.bias.copy_(case.bias)
    output = conv(case.inputs.to(device=device, dtype=dtype))
    output.backward(case.grad_output.to(device=device, dtype=dtype))
    return ConvResult(
        output=output.detach().cpu(),
        weight_grad=conv.weight.grad.detach().cpu(),
        bias_grad=conv.bias.grad.detach().cpu(),
    )


def compare_conv_results(
    actual: ConvResult, expected: ConvResult, rtol: float = FP32_RTOL, atol: float = FP32_ATOL
) -> Comparison:
    """Every tensor finite and within rtol/atol of the reference (compared in float64)."""
    worst = 0.0
    for name in ("output", "weight_grad", "bias_grad"):
        got = getattr(actual, name).double()
        want = getattr(expected, name).double()
        if got.shape != want.shape:
            return Comparison(False, float("inf"), f"{name} shape {tuple(got.shape)} != {tuple(want.shape)}")
        if not torch.isfinite(got).all():
            return Comparison(False, float("inf"), f"{name} has non-finite values")
        diff = (got - want).abs()
        worst = max(worst, float(diff.max()))
        if not torch.allclose(got, want, rtol=rtol, atol=atol):
            detail = f"{name} differs from the reference (max |diff| {float(diff.max()):.2e}, "
            return Comparison(False, worst, detail + f"rtol {rtol:g}, atol {atol:g})")
    return Comparison(True, worst, f"forward+backward match (max |diff| {worst:.1e})")


@contextmanager
def ieee_fp32() -> Iterator[None]:
    """Disable TF32 for convolutions and matmuls, restoring the caller's settings afterwards
    (hardware.backends: the fp32_precision API where torch has it, never mixed with the legacy flags)."""
    with backends.tf32(False):
        yield


def cpu_kernel_check(case: ConvCase) -> tuple[Comparison, ConvResult | None]:
    """CPU fp32 against a CPU float64 reference; also returns the fp32 result for GPU checks."""
    try:
        fp32 = run_conv(case, "cpu", torch.float32)
        reference = run_conv(case, "cpu", torch.float64)
    except Exception as exc:
        return Comparison(False, float("inf"), f"conv2d failed on the CPU: {one_line(exc)}"), None
    return compare_conv_results(fp32, reference), fp32


def gpu_kernel_check(case: ConvCase, device: str, cpu_reference: ConvResult | None) -> Comparison:
    """Device fp32 (TF32 off) against the CPU fp32 result."""
    if cpu_reference is None:
        return Comparison(False, float("inf"), "no CPU reference (the CPU kernel check failed)")
    try:
        with ieee_fp32():
            result = run_conv(case, device, torch.float32)
            torch.cuda.synchronize(device)
    except Exception as exc:
        detail = f"conv2d failed on {device}: {one_line(exc)}{_kernel_error_hint(exc)}"
        return Comparison(False, float("inf"), detail)
    return compare_conv_results(result, cpu_reference)


def _kernel_error_hint(exc: Exception) -> str:
    message = str(exc).lower()
    if "no kernel image" in message:
        return " (this torch wheel has no kernels for this GPU's compute capability: install one that does)"
    if "invalid device function" in message or "nobinaryforgpu" in message:
        return " (this ROCm build has no kernels for this gfx arch: try HSA_OVERRIDE_GFX_VERSION)"
    return ""


def kernel_entry(comparison: Comparison, seconds: float) -> dict[str, Any]:
    return {
        "status": "ok" if comparison.ok else "fail",
        "detail": comparison.detail,
        "max_abs_diff": comparison.max_abs_diff if comparison.max_abs_diff != float("inf") else None,
        "seconds": round(seconds, 4),
    }
