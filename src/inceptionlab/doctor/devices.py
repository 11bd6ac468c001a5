"""Each device's entry in the report: the CPU (capability, bf16 autocast) and every visible GPU (name,
memory, arch, bf16/fp16), each with its kernel check."""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from inceptionlab.doctor.kernels import ConvCase, ConvResult, cpu_kernel_check, gpu_kernel_check, kernel_entry
from inceptionlab.doctor.report import BuildInfo, Check, one_line
from inceptionlab.host import cpu_model_name
from inceptionlab.runtime import cpu_capability


def cpu_bf16_autocast() -> tuple[bool, str]:
    """Run a tiny matmul under CPU bf16 autocast and check it really ran in bf16, sensibly."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(16, 16, generator=gen)
    b = torch.randn(16, 16, generator=gen)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = a @ b
    except Exception as exc:
        return False, f"bf16 autocast failed: {one_line(exc)}"
    if out.dtype != torch.bfloat16:
        return False, f"autocast produced {out.dtype}, not bfloat16"
    # bf16 has an 8-bit mantissa: ~1e-2 relative error is normal, garbage is not.
    if not torch.allclose(out.float(), a @ b, rtol=5e-2, atol=5e-2):
        return False, "bf16 matmul result is wrong"
    return True, f"bf16 autocast works ({_cpu_bf16_hardware()})"


def _cpu_bf16_hardware() -> str:
    try:
        native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:
        return "hardware support unknown"
    return "native bf16 instructions" if native else "emulated, slow"


def describe_gpu(index: int, build: BuildInfo) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    rocm = build.kind == "rocm"
    return {
        "type": "rocm" if rocm else "cuda",
        "device": f"cuda:{index}",  # ROCm devices are addressed as "cuda" in torch too
        "index": index,
        "name": props.name,
        "total_memory_gib": round(props.total_memory / 2**30, 2),
        "compute_capability": None if rocm else f"{props.major}.{props.minor}",
        "gfx_arch": getattr(props, "gcnArchName", None) if rocm else None,
        "bf16": _gpu_bf16_supported(index),
        "fp16": _gpu_fp16_works(f"cuda:{index}"),
    }


def _gpu_bf16_supported(index: int) -> bool:
    with torch.cuda.device(index):
        try:
            # Native only: emulated bf16 "works" but is not what anyone wants to train in.
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # torch < 2.3 has no including_emulation
            return bool(torch.cuda.is_bf16_supported())


def _gpu_fp16_works(device: str) -> bool:
    # Run it rather than infer it from the compute capability: a missing fp16 kernel shows up here.
    try:
        ones = torch.ones(8, 8, dtype=torch.float16, device=device)
        return bool(((ones @ ones) == 8).all())
    except Exception:
        return False


def format_gpu(entry: dict[str, Any]) -> str:
    arch = f"gfx {entry['gfx_arch']}" if entry["gfx_arch"] else f"sm {entry['compute_capability']}"
    precisions = ", ".join(p for p in ("bf16", "fp16") if entry[p]) or "no bf16/fp16"
    return f"{entry['name']}, {entry['total_memory_gib']:.1f} GiB, {arch}, {precisions}"


def cpu_device(case: ConvCase) -> tuple[dict[str, Any], list[Check], ConvResult | None]:
    capability, cores = cpu_capability(), os.cpu_count() or 0
    bf16_ok, bf16_detail = cpu_bf16_autocast()
    started = time.perf_counter()
    comparison, fp32_result = cpu_kernel_check(case)
    kernel = kernel_entry(comparison, time.perf_counter() - started)
    entry = {
        "type": "cpu",
        "device": "cpu",
        "name": cpu_model_name(),
        "capability": capability,
        "cpu_count": cores,
        "torch_threads": torch.get_num_threads(),
        "bf16_autocast": bf16_ok,
        "kernel": kernel,
    }
    summary = f"{entry['name']}, {capability}, {cores} cores, {entry['torch_threads']} torch threads"
    checks = [
        Check("cpu", "ok", summary),
        # bf16 on the CPU is a nice-to-have, so a failure only warns.
        Check("cpu bf16", "ok" if bf16_ok else "warn", bf16_detail),
        Check("kernel cpu", kernel["status"], f"conv2d fp32 vs fp64: {comparison.detail}"),
    ]
    return entry, checks, fp32_result


def gpu_device(
    index: int, build: BuildInfo, case: ConvCase, cpu_reference: ConvResult | None
) -> tuple[dict[str, Any], list[Check]]:
    device = f"cuda:{index}"
    try:
        entry = describe_gpu(index, build)
    except Exception as exc:
        entry = {"type": build.kind, "device": device, "index": index, "error": one_line(exc)}
        return entry, [Check(device, "fail", f"cannot query the device: {one_line(exc)}")]
    started = time.perf_counter()
    comparison = gpu_kernel_check(case, device, cpu_reference)
    entry["kernel"] = kernel_entry(comparison, time.perf_counter() - started)
    checks = [
        Check(device, "ok", format_gpu(entry)),
        Check(
            f"kernel {device}",
            entry["kernel"]["status"],
            f"conv2d fp32 (TF32 off) vs CPU fp32: {comparison.detail}",
        ),
    ]
    return entry, checks
