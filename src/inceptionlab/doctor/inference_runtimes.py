"""The providers ONNX Runtime and the devices OpenVINO can use here, and the package to install for a GPU."""

from __future__ import annotations

import sys

from inceptionlab.doctor.probes import SystemProbes
from inceptionlab.doctor.report import Check
from inceptionlab.torch_build import ORT_NVIDIA, migraphx_advice


def runtime_checks(probes: SystemProbes, gpu: str | None) -> list[Check]:
    """The providers ONNX Runtime and the devices OpenVINO can use here; with a GPU present (`gpu`:
    "nvidia" or "amd") but only CPU providers, the command that installs the GPU package."""
    targets = probes.runtime_targets()
    checks = []
    providers = targets.get("onnxruntime")
    if providers is None:
        checks.append(Check("onnxruntime", "ok", "not installed (the `onnx` extra: pip install 'inceptionlab[onnx]')"))
    else:
        listing = f"providers: {', '.join(providers)}"
        python = sys.executable
        if gpu == "nvidia" and "CUDAExecutionProvider" not in providers:
            checks.append(Check("onnxruntime", "warn", (
                f"{listing}: the CPU-only package, with an NVIDIA GPU here: `{python} -m pip uninstall -y onnxruntime "
                f"&& {python} -m pip install {ORT_NVIDIA}` (`make clean setup` picks it where torch sees the GPU)")))
        elif gpu == "amd" and "MIGraphXExecutionProvider" not in providers:
            checks.append(Check("onnxruntime", "warn", (
                f"{listing}: no MIGraphX provider for the AMD GPU here: {migraphx_advice(python, probes.rocm_version())}")))
        else:
            checks.append(Check("onnxruntime", "ok", listing))
    devices = targets.get("openvino")
    if devices is None:
        checks.append(Check("openvino", "ok", "not installed (the `openvino` extra)"))
    else:
        note = "; OpenVINO runs on CPUs and Intel GPUs only" if gpu else ""
        checks.append(Check("openvino", "ok", f"devices: {', '.join(devices)}{note}"))
    return checks
