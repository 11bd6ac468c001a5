"""Which torch an interpreter has, and which build this machine needs: standard library only, no torch import.

Two users, one home: `inceptionlab doctor` (is this venv's torch the right build for the machine's
GPU? `suggest_fix` names the make command that fixes it) and `tools/setup_plan.py`, which `make
setup` runs with the system interpreter before inceptionlab is installed, so nothing here may need
more than the standard library. The probe asks an interpreter in a subprocess, so a torch that
hangs or crashes on import (a stuck GPU driver) cannot take the caller down with it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# Importing torch takes 2-10 s; a minute means the interpreter hangs (e.g. a stuck GPU driver).
PROBE_TIMEOUT_S = 120
ROCM_VERSION_FILE = "/opt/rocm/.info/version"
# The CUDA build the default torch 2.14.1 pins resolve to on Linux x86_64 (2.14.1+cu130).
DEFAULT_CUDA_WHEEL = "cu130"
BUILD_LABELS = {"rocm": "ROCm build", "cuda": "CUDA build", "cpu": "CPU-only build"}
INDEX_HINT = "PyTorch's wheel index; pytorch.org/get-started/locally prints the full URL"

PROBE_SCRIPT = """
import json
info = {}
try:
    import torch
except Exception as exc:
    info["error"] = f"{type(exc).__name__}: {exc}"
else:
    info["torch"] = torch.__version__
    info["hip"] = getattr(torch.version, "hip", None)
    info["cuda"] = torch.version.cuda
    info["file"] = torch.__file__
    try:
        info["gpu_count"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        info["gpu_count"] = 0
    try:
        import torchvision
        info["torchvision"] = torchvision.__version__
    except Exception:
        info["torchvision"] = None
from importlib.metadata import PackageNotFoundError, version
info["ort"] = []
for name in ("onnxruntime", "onnxruntime-gpu", "onnxruntime-migraphx"):
    try:
        version(name)
    except PackageNotFoundError:
        continue
    info["ort"].append(name)
print("INCEPTIONLAB_PROBE " + json.dumps(info))
"""


@dataclass(frozen=True)
class TorchInfo:
    """The torch an interpreter imports: what it was built for and whether it sees a GPU."""

    version: str
    hip: str | None = None
    cuda: str | None = None
    gpu_count: int = 0
    torchvision: str | None = None
    file: str | None = None
    # The ONNX Runtime packages beside it (a container's own GPU build is kept): not part of torch's identity.
    ort_packages: tuple[str, ...] = field(default=(), compare=False)

    @property
    def kind(self) -> str:
        return build_kind(self.hip, self.cuda)

    def describe(self) -> str:
        seen = f"{self.gpu_count} GPU(s) visible" if self.gpu_count else "no GPU visible"
        return f"torch {self.version} ({describe_build(self.hip, self.cuda)}, {seen})"


def build_kind(hip: str | None, cuda: str | None) -> str:
    """rocm, cuda or cpu: what a torch was compiled for (its torch.version.hip / .cuda)."""
    # ROCm builds also set torch.version.cuda on some releases, so HIP wins.
    if hip:
        return "rocm"
    return "cuda" if cuda else "cpu"


def describe_build(hip: str | None, cuda: str | None) -> str:
    return {"rocm": f"ROCm build, HIP {hip}", "cuda": f"CUDA {cuda} build", "cpu": BUILD_LABELS["cpu"]}[
        build_kind(hip, cuda)]


def probe_torch(python: str, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> TorchInfo | None:
    """The torch that `python` imports, or None when it has none (or the probe fails)."""
    try:
        done = run([python, "-c", PROBE_SCRIPT], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("INCEPTIONLAB_PROBE ")), None)
    if line is None:
        return None
    info = json.loads(line.split(" ", 1)[1])
    if "torch" not in info:
        return None
    return TorchInfo(
        version=info["torch"],
        hip=info.get("hip"),
        cuda=info.get("cuda"),
        gpu_count=int(info.get("gpu_count") or 0),
        torchvision=info.get("torchvision"),
        file=info.get("file"),
        ort_packages=tuple(info.get("ort") or ()),
    )


def base_interpreter() -> str:
    """The system interpreter, even when this runs inside a venv (an activated .venv's python3)."""
    if sys.prefix != sys.base_prefix:
        base = getattr(sys, "_base_executable", None)
        if base and os.path.exists(base):
            return base
    return sys.executable


def rocm_version(path: str = ROCM_VERSION_FILE) -> str | None:
    """ROCm's major.minor from /opt/rocm/.info/version ("6.4.1-120" -> "6.4"), or None."""
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    parts = text.split("-")[0].split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 and all(p.isdigit() for p in parts[:2]) else None


# --------------------------------------------------------------------------- doctor's fix


def suggest_fix(
    venv_torch: TorchInfo,
    system_torch: TorchInfo | None,
    amd: bool,
    nvidia: bool,
    rocm: str | None = None,
) -> str | None:
    """The set-up command that gives this venv a torch able to use the machine's GPU, if the
    torch build is the problem; None when the build is right (then drivers, groups etc. are)."""
    if not (amd or nvidia):
        return None
    wanted = "rocm" if amd and not nvidia else "cuda" if nvidia and not amd else None
    if (
        system_torch is not None
        and system_torch.kind != "cpu"
        and system_torch.kind != venv_torch.kind
        and (wanted is None or system_torch.kind == wanted)
    ):
        return (
            f"`make clean setup TORCH_FROM_SYSTEM=1`: the system Python's {system_torch.describe()} "
            f"is hidden by this venv's own torch {venv_torch.version} ({BUILD_LABELS[venv_torch.kind]})"
        )
    if wanted == "rocm" and venv_torch.kind != "rocm":
        wheel = f"rocm{rocm}" if rocm else "rocmX.Y"
        return (
            f"`make clean setup TORCH_INDEX=.../whl/{wheel}` ({INDEX_HINT}; "
            f"{'ROCm ' + rocm + ' is installed here' if rocm else 'match the ROCm version in /opt/rocm/.info/version'})"
        )
    if wanted == "cuda" and venv_torch.kind != "cuda":
        return (
            f"`make clean setup TORCH_INDEX=.../whl/{DEFAULT_CUDA_WHEEL}` ({INDEX_HINT}; "
            "pick the cuXYZ that nvidia-smi's CUDA version supports)"
        )
    return None


# --------------------------------------------------------------------------- the machine's GPUs

# Signs of GPU hardware or drivers on a host, before any torch is imported (set-up runs before one is
# installed; doctor asks when torch sees none). amd-smi replaces rocm-smi (ROCm SMI's own docs:
# "AMD SMI will replace rocm_smi_lib over time"); either, or rocminfo, means a ROCm install.
AMD_DEVICE_FILES = ("/dev/kfd",)
NVIDIA_DEVICE_FILES = ("/dev/nvidia0",)
AMD_TOOLS = ("amd-smi", "rocm-smi", "rocminfo")
NVIDIA_TOOLS = ("nvidia-smi",)


def gpu_signs(vendor: str, exists: Callable[[str], bool] = os.path.exists,
              which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """Why this host looks like it has `vendor`'s ("amd" or "nvidia") GPUs, as readable reasons."""
    files, tools = (AMD_DEVICE_FILES, AMD_TOOLS) if vendor == "amd" else (NVIDIA_DEVICE_FILES, NVIDIA_TOOLS)
    return [f"{path} exists" for path in files if exists(path)] + [f"{tool} is on PATH" for tool in tools if which(tool)]


# --------------------------------------------------------------------------- ONNX Runtime's package

# ONNX Runtime ships one package per hardware target, each with the same `onnxruntime` module: two of
# them in one environment overwrite each other's files, so set-up installs exactly one.
ORT_CPU = "onnxruntime"  # CPU provider only (the `onnx` extra)
ORT_NVIDIA = "onnxruntime-gpu"  # + CUDA and TensorRT providers (the `onnx-gpu` extra)
ORT_AMD = "onnxruntime-migraphx"  # + AMD's MIGraphX provider: AMD builds it per ROCm release
ORT_PACKAGES = (ORT_CPU, ORT_NVIDIA, ORT_AMD)
ORT_EXTRAS = {ORT_CPU: "onnx", ORT_NVIDIA: "onnx-gpu"}
AMD_WHEELS_HINT = ("AMD's wheel folder for ROCm {rocm}: the ROCm docs' \"Install ONNX Runtime for Radeon GPUs\" "
                   "page names it; MIGraphX itself comes with ROCm (`apt install migraphx`)")


@dataclass(frozen=True)
class OrtChoice:
    """Which ONNX Runtime package an environment gets, why, and a step set-up leaves to the user."""

    package: str
    reason: str
    advice: str | None = None  # a command to run by hand (AMD's package is not on the package index)

    @property
    def extra(self) -> str | None:
        """The pyproject extra that installs `package`; None for one installed by hand."""
        return ORT_EXTRAS.get(self.package)


def migraphx_advice(python: str = "python", rocm: str | None = None) -> str:
    """The commands that swap the CPU-only onnxruntime for AMD's MIGraphX build (printed, never run)."""
    where = "AMD_WHEELS"
    return (f"`{python} -m pip uninstall -y {ORT_CPU} && {python} -m pip install {ORT_AMD} -f {where}`, "
            f"{where} being {AMD_WHEELS_HINT.format(rocm=rocm or 'X.Y (/opt/rocm/.info/version)')}")


def choose_ort_package(gpu: str | None, *, python: str = "python", rocm: str | None = None,
                       installed: frozenset[str] = frozenset(), asked: str = "auto") -> OrtChoice:
    """The ONNX Runtime package for a torch that uses `gpu` ("nvidia", "amd" or None).

    NVIDIA: onnxruntime-gpu, whose CUDA and TensorRT providers the CPU-only package lacks. AMD: the
    CPU-only package plus the command for AMD's MIGraphX build, which is published per ROCm release
    outside the package index (set-up never installs from an index the user did not name). An
    onnxruntime-migraphx already `installed` (by that command, or in a ROCm container's Python whose
    torch the venv reuses) is kept. `asked`: auto | cpu | gpu.
    """
    if asked == "cpu":
        return OrtChoice(ORT_CPU, "ONNX_RUNTIME=cpu: the CPU-only onnxruntime")
    if asked == "gpu" and gpu != "amd":
        return OrtChoice(ORT_NVIDIA, "ONNX_RUNTIME=gpu: onnxruntime-gpu (CUDA and TensorRT providers)")
    if gpu == "amd":
        if ORT_AMD in installed:
            return OrtChoice(ORT_AMD, f"keeping the {ORT_AMD} already installed (MIGraphX provider)")
        return OrtChoice(ORT_CPU, "ROCm torch: the CPU-only onnxruntime; its MIGraphX provider is AMD's own build",
                         advice=f"for ONNX Runtime on the AMD GPU: {migraphx_advice(python, rocm)}")
    if gpu == "nvidia":
        return OrtChoice(ORT_NVIDIA, "torch uses an NVIDIA GPU: onnxruntime-gpu (CUDA and TensorRT providers)")
    return OrtChoice(ORT_CPU, "no GPU for torch: the CPU-only onnxruntime")
