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
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
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
