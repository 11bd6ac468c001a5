"""The capability probe: what this CPU or GPU is, asked of torch and oneDNN without timing a model, and
the one-line warning when a precision can only be emulated here."""

from __future__ import annotations

import logging
import platform
import time
from typing import Any

from inceptionlab.hardware.facts import DeviceFacts, gpu_facts_from, no_bf16_reason
from inceptionlab.host import cpu_flags, cpu_model_name

log = logging.getLogger(__name__)


def cpu_facts() -> DeviceFacts:
    """The CPU as torch's kernels will use it.

    bf16/fp16 come from oneDNN's own checks (`torch.ops.mkldnn._is_mkldnn_bf16_supported`, `..._fp16_...`:
    AVX512-FP16 or AMX-FP16), which also honour ONEDNN_MAX_CPU_ISA: a CPU limited to AVX2 that way reports
    neither, as it should.
    """
    import torch  # start-up time: callers that only need the name (loadtest) never pay for torch

    capability = _cpu_capability(torch)
    bf16 = _mkldnn_supports(torch, "bf16")
    flags = cpu_flags()
    amx = bf16 and "amx_bf16" in flags
    return DeviceFacts("cpu", cpu_model_name(), capability, bf16=bf16, fp16=_mkldnn_supports(torch, "fp16"), amx=amx)


def _cpu_capability(torch: Any) -> str:
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # older torch or an exotic platform
        return platform.machine() or "unknown"


def _mkldnn_supports(torch: Any, what: str) -> bool:
    check = getattr(torch.ops.mkldnn, f"_is_mkldnn_{what}_supported", None)
    try:
        return bool(check()) if check is not None else False
    except Exception:  # a build without oneDNN
        return False


def gpu_facts(index: int = 0) -> DeviceFacts:
    import torch  # start-up time: the package is imported before torch

    props = torch.cuda.get_device_properties(index)
    if getattr(torch.version, "hip", None):
        return gpu_facts_from(props.name, "rocm", gfx=getattr(props, "gcnArchName", None))
    return gpu_facts_from(props.name, "cuda", props.major, props.minor)


def device_facts(device: Any) -> DeviceFacts:
    """Facts for a torch.device (or its name): the CPU's, or GPU index N's."""
    import torch  # start-up time: the package is imported before torch

    device = torch.device(device)
    if device.type == "cuda":
        return gpu_facts(device.index if device.index is not None else torch.cuda.current_device())
    return cpu_facts()


def emulation_warning(facts: DeviceFacts, precision: str, measure: bool = True) -> str | None:
    """A one-line warning when `precision` can only be emulated here, with the slowdown to expect.

    On a CPU the slowdown is measured at once on one convolution (64 channels, 40x40, batch 8, channels
    last: 0.05-0.3 s): 6.6-10.5x on an AMD EPYC capped to AVX2, against 0.5x (faster) with bf16 units.
    fp16 likewise on a CPU without AVX512-FP16/AMX-FP16 units: the issue that asked for this warning saw eager
    fp16 ~80x slower than fp32 on the demo model (AMD EPYC Zen 3, 2026-11-26), while ONNX Runtime and
    OpenVINO skip fp16 there with a reason.
    """
    if precision == "fp16" and facts.kind == "cpu" and not facts.fp16:
        return _cpu_emulation_warning(facts, "fp16", "avx512_fp16/amx_fp16", measure)
    if precision != "bf16" or facts.bf16:
        return None
    if facts.kind != "cpu":
        return f"bf16: {no_bf16_reason(facts)}"
    return _cpu_emulation_warning(facts, "bf16", "avx512_bf16/amx_bf16", measure)


# What whole models measured when emulated on an AMD EPYC Zen 3 (AVX2 only), 2026-11-24/26.
_EMULATED_MODELS = {"bf16": "whole models measured 6-34x slower on such a CPU",
                    "fp16": "the demo model measured ~80x slower in eager mode on such a CPU"}


def _cpu_emulation_warning(facts: DeviceFacts, precision: str, units: str, measure: bool) -> str:
    factor = conv_slowdown(precision) if measure else None
    expected = f"{factor:.1f}x slower than fp32 on one convolution here" if factor else "10-30x slower than fp32"
    return (f"{precision} is emulated on this CPU ({facts.name}, {facts.arch}: no {units} units as oneDNN "
            f"reports): expect it {expected}; {_EMULATED_MODELS[precision]}")


def conv_slowdown(precision: str, repeats: int = 3) -> float | None:
    """Seconds of one conv under `precision` autocast over fp32 seconds, on the CPU (None on failure)."""
    import torch  # start-up time: the package is imported before torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    conv = torch.nn.Conv2d(64, 64, 3, padding=1).to(memory_format=torch.channels_last)
    x = torch.randn(8, 64, 40, 40).contiguous(memory_format=torch.channels_last)

    def run(enabled: bool) -> float:
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=enabled):
            conv(x)
            start = time.perf_counter()
            for _ in range(repeats):
                conv(x)
            return time.perf_counter() - start

    try:
        return run(True) / run(False)
    except Exception:
        log.debug("conv slowdown probe failed", exc_info=True)
        return None
