"""Installation check: is this torch install able to train on this machine's hardware?

The ROCm Deep Learning Guide's "verify your installation" step, done properly: versions and
build, every visible GPU, a real Conv2d forward+backward on each device compared against a
CPU reference, and, when a GPU is expected but torch sees none, the usual causes.

`run_doctor()` returns a `DoctorReport`; it never prints. Everything that looks at the host
(device files, PATH, groups, environment, torch's GPU count and arch list, /dev/shm, the inference
runtimes' providers) goes through `SystemProbes`, so tests can simulate "AMD hardware present, no GPU
visible", a GPU whose arch this torch has no kernels for, or Docker's 64 MiB /dev/shm on any machine.

Checks beyond the versions and kernels, each naming its fix: GPU monitoring tools (amd-smi before the
deprecated rocm-smi, nvidia-smi); with AMD hardware, access to /dev/kfd and the render nodes and the
video/render groups; each GPU's arch against `torch.cuda.get_arch_list()`; /dev/shm against what the
guide's loop's DataLoader workers need; the providers ONNX Runtime and the devices OpenVINO can use.
"""

from __future__ import annotations

import glob
import importlib
import os
import platform
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from inceptionlab.host import cpu_model_name, shared_memory_space
from inceptionlab.runtime import cpu_capability
from inceptionlab.torch_build import (AMD_DEVICE_FILES, NVIDIA_DEVICE_FILES, ORT_NVIDIA, TorchInfo, base_interpreter,
                                      build_kind, describe_build, gpu_signs, migraphx_advice, probe_torch,
                                      rocm_version, suggest_fix)

if TYPE_CHECKING:
    from inceptionlab.doctor_train import TrainCheckSettings

Status = Literal["ok", "warn", "fail"]

# fp32 device result vs CPU fp32 (and CPU fp32 vs fp64): a 3x3x3 conv accumulates 27 products
# per output, so honest fp32 kernels agree far inside this; TF32 (10-bit mantissa) or a broken
# kernel does not.
FP32_RTOL = 1e-3
FP32_ATOL = 1e-4

# Monitoring tools, preferred first: amd-smi replaces rocm-smi ("AMD SMI will replace rocm_smi_lib over
# time. We recommend that users transition to AMD SMI": ROCm SMI's documentation; ROCm 7's TheRock
# builds no longer ship it).
GPU_TOOLS = ("amd-smi", "rocm-smi", "nvidia-smi", "rocminfo")
AMD_SMI_INSTALL = "`sudo apt install amd-smi-lib` (AMD's ROCm packages; `dnf` on RHEL)"
VISIBILITY_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
RENDER_NODES_GLOB = "/dev/dri/renderD*"
GPU_GROUPS = ("render", "video")
CONTAINER_DEVICES = "docker run --device=/dev/kfd --device=/dev/dri --group-add video --group-add render"
# HSA_OVERRIDE_GFX_VERSION makes ROCm run a sibling's kernels on a GPU this torch has none for:
# (family prefix, family, the sibling torch builds for, the value). RDNA2 gfx1031/1032/1034/1035/1036 ->
# gfx1030 (e.g. ROCm/rocALUTION#197, pytorch/pytorch#132570 on gfx1031); RDNA3 gfx1101/1102/1103 ->
# gfx1100 (ROCm/bitsandbytes#29). Not supported by AMD, and it can hang a GPU whose ISA differs too much
# (ROCm/TheRock#1184, gfx1103): suggested by name, never set.
GFX_OVERRIDES = (("gfx103", "RDNA2", "gfx1030", "10.3.0"), ("gfx110", "RDNA3", "gfx1100", "11.0.0"))


# --------------------------------------------------------------------------- data types


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str


@dataclass(frozen=True)
class BuildInfo:
    """What torch was compiled for: CUDA, ROCm (HIP) or CPU only."""

    cuda: str | None
    hip: str | None

    @classmethod
    def from_torch(cls) -> BuildInfo:
        return cls(cuda=torch.version.cuda, hip=getattr(torch.version, "hip", None))

    @property
    def kind(self) -> str:
        return build_kind(self.hip, self.cuda)

    def describe(self) -> str:
        return describe_build(self.hip, self.cuda)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "cuda": self.cuda, "hip": self.hip, "description": self.describe()}


def _read_write_access(path: str) -> bool:
    return os.access(path, os.R_OK | os.W_OK)


def _current_user_groups() -> frozenset[str]:
    # os.getgroups() is the *process's* groups: after `usermod -aG render` they only appear
    # after a new login, which is exactly the state we want to diagnose.
    try:
        import grp  # POSIX only
    except ImportError:  # not POSIX
        return frozenset()
    names = set()
    for gid in {*os.getgroups(), os.getgid()}:
        try:
            names.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue
    return frozenset(names)


def _account_groups() -> frozenset[str]:
    """Groups the account belongs to in the group database (/etc/group), active in this login or not."""
    try:
        import grp
        import pwd  # POSIX only
    except ImportError:  # not POSIX
        return frozenset()
    try:
        user = pwd.getpwuid(os.getuid())
    except KeyError:  # a container user without a passwd entry
        return frozenset()
    names = {g.gr_name for g in grp.getgrall() if user.pw_name in g.gr_mem}
    try:
        names.add(grp.getgrgid(user.pw_gid).gr_name)
    except KeyError:
        pass
    return frozenset(names)


def _torch_gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _torch_gpu_arch(index: int) -> str | None:
    """The GPU's arch as torch's arch list spells it: "gfx90a" (ROCm) or "sm_86" (CUDA)."""
    props = torch.cuda.get_device_properties(index)
    if getattr(torch.version, "hip", None):
        gfx = getattr(props, "gcnArchName", None)
        return gfx.split(":")[0] if gfx else None  # "gfx90a:sramecc+:xnack-" -> "gfx90a"
    return f"sm_{props.major}{props.minor}"


def _torch_arch_list() -> list[str]:
    try:
        return list(torch.cuda.get_arch_list())
    except Exception:  # a build without GPU support, or an uninitialisable driver
        return []


def _runtime_targets() -> dict[str, list[str] | None]:
    """What each inference runtime can run on here (None: not installed): ONNX Runtime's providers
    (`get_available_providers()`: those compiled into the installed package) and OpenVINO's devices."""
    from inceptionlab.infer.runtimes import ort_installed_providers  # start-up time: onnxruntime, on use

    targets: dict[str, list[str] | None] = {"onnxruntime": ort_installed_providers() or None}
    try:
        import openvino  # optional extra (openvino), imported on use
    except ImportError:
        targets["openvino"] = None
    else:
        targets["openvino"] = list(openvino.Core().available_devices)
    return targets


def _torch_gpu_init_error() -> str | None:
    """torch's own reason for seeing no GPU (e.g. 'Found no NVIDIA driver'), if it gives one."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.cuda.init()
    except Exception as exc:  # torch raises AssertionError/RuntimeError depending on build
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


def _system_torch() -> TorchInfo | None:
    """The torch of the interpreter this venv was made from (a subprocess: importing it takes seconds);
    None outside a venv, where the system torch is the one running."""
    if sys.prefix == sys.base_prefix:
        return None
    return probe_torch(base_interpreter())


@dataclass(frozen=True)
class SystemProbes:
    """Everything the doctor learns from the host, replaceable in tests."""

    exists: Callable[[str], bool] = os.path.exists
    which: Callable[[str], str | None] = shutil.which
    glob_paths: Callable[[str], list[str]] = glob.glob
    accessible: Callable[[str], bool] = _read_write_access
    user_groups: Callable[[], frozenset[str]] = _current_user_groups
    env: Mapping[str, str] = field(default_factory=lambda: os.environ)
    gpu_count: Callable[[], int] = _torch_gpu_count
    gpu_init_error: Callable[[], str | None] = _torch_gpu_init_error
    system_torch: Callable[[], TorchInfo | None] = _system_torch
    rocm_version: Callable[[], str | None] = rocm_version
    account_groups: Callable[[], frozenset[str]] = _account_groups
    gpu_arch: Callable[[int], str | None] = _torch_gpu_arch
    arch_list: Callable[[], list[str]] = _torch_arch_list
    shared_memory: Callable[[], tuple[int, int] | None] = shared_memory_space
    runtime_targets: Callable[[], dict[str, list[str] | None]] = _runtime_targets


@dataclass
class DoctorReport:
    python: str
    torch: str
    torchvision: str | None
    build: BuildInfo
    devices: list[dict[str, Any]]
    checks: list[Check]
    fix: str | None = None  # the set-up command that gives torch the machine's GPU, when the build is the problem

    @property
    def ok(self) -> bool:
        return not self.failed_checks()

    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "python": self.python,
            "torch": self.torch,
            "torchvision": self.torchvision,
            "build": self.build.to_dict(),
            "devices": self.devices,
            "checks": [asdict(c) for c in self.checks],
            "fix": self.fix,
        }


# --------------------------------------------------------------------------- kernel check


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
    """Disable TF32 for convolutions and matmuls, restoring the caller's settings afterwards."""
    cudnn_conv = getattr(torch.backends.cudnn, "conv", None)
    matmul = torch.backends.cuda.matmul
    if cudnn_conv is not None and hasattr(cudnn_conv, "fp32_precision"):
        # torch >= 2.9: the per-operator API. Reading the legacy allow_tf32 flags after it has
        # been used can raise, so touch only these two and put back exactly what was there.
        saved = (cudnn_conv.fp32_precision, matmul.fp32_precision)
        cudnn_conv.fp32_precision = matmul.fp32_precision = "ieee"
        try:
            yield
        finally:
            cudnn_conv.fp32_precision, matmul.fp32_precision = saved
    else:
        saved = (torch.backends.cudnn.allow_tf32, matmul.allow_tf32)
        torch.backends.cudnn.allow_tf32 = matmul.allow_tf32 = False
        try:
            yield
        finally:
            torch.backends.cudnn.allow_tf32, matmul.allow_tf32 = saved


def cpu_kernel_check(case: ConvCase) -> tuple[Comparison, ConvResult | None]:
    """CPU fp32 against a CPU float64 reference; also returns the fp32 result for GPU checks."""
    try:
        fp32 = run_conv(case, "cpu", torch.float32)
        reference = run_conv(case, "cpu", torch.float64)
    except Exception as exc:
        return Comparison(False, float("inf"), f"conv2d failed on the CPU: {_one_line(exc)}"), None
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
        detail = f"conv2d failed on {device}: {_one_line(exc)}{_kernel_error_hint(exc)}"
        return Comparison(False, float("inf"), detail)
    return compare_conv_results(result, cpu_reference)


def _kernel_error_hint(exc: Exception) -> str:
    message = str(exc).lower()
    if "no kernel image" in message:
        return " (this torch wheel has no kernels for this GPU's compute capability: install one that does)"
    if "invalid device function" in message or "nobinaryforgpu" in message:
        return " (this ROCm build has no kernels for this gfx arch: try HSA_OVERRIDE_GFX_VERSION)"
    return ""


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def kernel_entry(comparison: Comparison, seconds: float) -> dict[str, Any]:
    return {
        "status": "ok" if comparison.ok else "fail",
        "detail": comparison.detail,
        "max_abs_diff": comparison.max_abs_diff if comparison.max_abs_diff != float("inf") else None,
        "seconds": round(seconds, 4),
    }


# --------------------------------------------------------------------------- CPU facts


def cpu_bf16_autocast() -> tuple[bool, str]:
    """Run a tiny matmul under CPU bf16 autocast and check it really ran in bf16, sensibly."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(16, 16, generator=gen)
    b = torch.randn(16, 16, generator=gen)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = a @ b
    except Exception as exc:
        return False, f"bf16 autocast failed: {_one_line(exc)}"
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


# --------------------------------------------------------------------------- GPU facts


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


# --------------------------------------------------------------------------- version checks


def python_check() -> Check:
    version = platform.python_version()
    return Check("python", "ok", f"{version} ({platform.python_implementation()})")


def torch_check(build: BuildInfo) -> Check:
    return Check("torch", "ok", f"{torch.__version__} ({build.describe()})")


def torchvision_check(
    torch_version: str, importer: Callable[[str], Any] = importlib.import_module
) -> tuple[Check, str | None]:
    """Import torchvision; a failure (often an ABI mismatch with torch) is a failing check."""
    fix = f"install the torchvision that matches torch {torch_version}"
    try:
        torchvision = importer("torchvision")
    except Exception as exc:
        return Check("torchvision", "fail", f"import failed: {_one_line(exc)}; {fix}"), None
    version = str(getattr(torchvision, "__version__", "unknown"))
    mismatch = _torchvision_mismatch(torch_version, version)
    if mismatch:
        return Check("torchvision", "warn", f"{version}: {mismatch}; {fix}"), version
    return Check("torchvision", "ok", version), version


def _torchvision_mismatch(torch_version: str, torchvision_version: str) -> str | None:
    torch_public, _, torch_local = torch_version.partition("+")
    tv_public, _, tv_local = torchvision_version.partition("+")
    if torch_local and tv_local and torch_local != tv_local:
        return f"built for +{tv_local} but torch is +{torch_local}"
    # Since torch 2.0 / torchvision 0.15 each torch 2.N release pairs with torchvision 0.(N+15).
    torch_parts, tv_parts = torch_public.split("."), tv_public.split(".")
    if len(torch_parts) >= 2 and len(tv_parts) >= 2 and torch_parts[0] == "2" and tv_parts[0] == "0":
        if torch_parts[1].isdigit() and tv_parts[1].isdigit():
            expected = int(torch_parts[1]) + 15
            if int(tv_parts[1]) != expected:
                return f"torch {torch_public} pairs with torchvision 0.{expected}"
    return None


def build_check(build: BuildInfo) -> Check:
    return Check("build", "ok", build.describe())


def tools_check(probes: SystemProbes) -> Check:
    """Which GPU monitoring tools exist, the one to use, and what to install where one is missing."""
    found = {tool: probes.which(tool) for tool in GPU_TOOLS}
    listing = ", ".join(f"{tool} {path}" if path else f"{tool} absent" for tool, path in found.items())
    notes, status = [], "ok"
    if found["amd-smi"]:
        notes.append("monitor AMD GPUs with amd-smi")
    elif found["rocm-smi"]:
        notes.append(f"only rocm-smi, which is deprecated (amd-smi replaces it): install amd-smi, {AMD_SMI_INSTALL}")
    elif _amd_evidence(probes):
        status = "warn"
        notes.append(f"AMD GPU hardware but no amd-smi to monitor it: {AMD_SMI_INSTALL}")
    if found["nvidia-smi"]:
        notes.append("monitor NVIDIA GPUs with nvidia-smi")
    elif _nvidia_evidence(probes):
        status = "warn"
        notes.append("NVIDIA GPU hardware but no nvidia-smi: it comes with the driver's utilities "
                     "(`sudo apt install nvidia-utils-<driver branch>`)")
    return Check("tools", status, "; ".join([listing, *notes]))


# --------------------------------------------------------------------------- AMD device access


def gpu_access_check(probes: SystemProbes) -> Check | None:
    """With AMD hardware (or ROCm tools) present: /dev/kfd and the render nodes exist and are readable
    and writable; if not, the exact fix (groups, a new login, the container's --device flags)."""
    if not _amd_evidence(probes):
        return None
    nodes = sorted(probes.glob_paths(RENDER_NODES_GLOB))
    missing = [path for path in AMD_DEVICE_FILES if not probes.exists(path)] + ([] if nodes else [RENDER_NODES_GLOB])
    if missing:
        return Check("gpu access", "fail", (
            f"{' and '.join(missing)} missing: the amdgpu driver is not loaded (`sudo modprobe amdgpu`; "
            f"`dmesg | grep -i amdgpu` says why), or this is a container started without the devices: `{CONTAINER_DEVICES}`"))
    denied = [path for path in (*AMD_DEVICE_FILES, *nodes) if not probes.accessible(path)]
    groups = probes.user_groups()
    if not denied:
        member = ", ".join(g for g in GPU_GROUPS if g in groups) or "neither render nor video, but the files allow it"
        return Check("gpu access", "ok", f"{', '.join((*AMD_DEVICE_FILES, *nodes))} readable and writable (groups: {member})")
    return Check("gpu access", "fail", f"no read/write access to {', '.join(denied)}: {_access_fix(groups, probes.account_groups())}")


def _access_fix(active: frozenset[str], account: frozenset[str]) -> str:
    lacking = [g for g in GPU_GROUPS if g not in active]
    pending = [g for g in lacking if g in account]
    if pending:
        return (f"you were added to {'/'.join(pending)} but this login predates it: log out and back in "
                f"(or `newgrp {pending[0]}` in this shell)")
    if lacking:
        return (f"you are not in the {'/'.join(lacking)} group(s): `sudo usermod -aG render,video $USER`, then log "
                f"out and back in (in a container: `{CONTAINER_DEVICES}`)")
    return ("you are in the render and video groups, so the files' own permissions are wrong: `ls -l /dev/kfd "
            "/dev/dri/renderD*` shows their group and mode (the amdgpu udev rules set render, mode 0660)")


# --------------------------------------------------------------------------- GPU arch vs torch's kernels


def arch_runs(arch: str, arch_list: list[str]) -> str | None:
    """The entry of torch's arch list whose kernels run on `arch`, or None.

    ROCm: only the same gfx target (no compatibility across targets). CUDA: a cubin of the same major
    and an equal or lower minor (sm_80 runs on sm_86), an arch-specific one ("sm_90a") only on that
    exact GPU, or PTX ("compute_80") of an equal or lower capability, compiled at first use.
    """
    if arch.startswith("gfx"):
        return next((entry for entry in arch_list if entry.split(":")[0] == arch), None)
    device = _capability(arch)
    if device is None:
        return None
    cubins, ptx = [], []
    for entry in arch_list:
        kind, _, number = entry.partition("_")
        built = _capability(entry)
        if built is None:
            continue
        specific = number[-1:].isalpha()  # sm_90a, sm_100f: arch- or family-specific
        if kind == "sm" and built[0] == device[0] and (built[1] == device[1] if specific else built[1] <= device[1]):
            cubins.append((built, entry))
        elif kind == "compute" and not specific and built <= device:
            ptx.append((built, entry))
    # The closest binary first (what CUDA loads), PTX only where no binary runs.
    return max(cubins)[1] if cubins else max(ptx)[1] if ptx else None


def _capability(arch: str) -> tuple[int, int] | None:
    digits = "".join(ch for ch in arch.partition("_")[2] if ch.isdigit())
    return (int(digits[:-1]), int(digits[-1])) if len(digits) >= 2 else None


def gfx_override(arch: str, arch_list: list[str]) -> tuple[str, str, str] | None:
    """(family, sibling, HSA_OVERRIDE_GFX_VERSION value) where a family sibling's kernels are in the list."""
    bases = {entry.split(":")[0] for entry in arch_list}
    for prefix, family, sibling, value in GFX_OVERRIDES:
        if arch.startswith(prefix) and arch != sibling and sibling in bases:
            return family, sibling, value
    return None


def arch_check(device: str, arch: str | None, arch_list: list[str], build: BuildInfo, env: Mapping[str, str]) -> Check:
    """Does this torch have kernels for the GPU's arch? If not, every kernel fails at its first launch."""
    name = f"arch {device}"
    if not arch or not arch_list:
        return Check(name, "ok", f"{arch or 'arch unknown'}; torch reports no arch list to compare with")
    match = arch_runs(arch, arch_list)
    if match == arch:
        return Check(name, "ok", f"{arch}: this torch has kernels for it")
    if match:
        how = "PTX compiled at first use (slow start)" if match.startswith("compute") else "binary-compatible kernels"
        return Check(name, "ok", f"{arch}: runs this torch's {match} ({how})")
    built = ", ".join(arch_list)
    this_torch = f"torch {torch.__version__} ({build.describe()})"
    if build.kind == "rocm":
        lines = [f"{arch} is not among the archs {this_torch} has kernels for ({built}): every GPU kernel fails "
                 "with 'HIP error: invalid device function'"]
        override = gfx_override(arch, arch_list)
        if env.get("HSA_OVERRIDE_GFX_VERSION"):
            lines.append(f"HSA_OVERRIDE_GFX_VERSION={env['HSA_OVERRIDE_GFX_VERSION']} is set, yet ROCm reports {arch}")
        elif override:
            family, sibling, value = override
            lines.append(f"{arch} is {family}: `export HSA_OVERRIDE_GFX_VERSION={value}` before starting runs "
                         f"{sibling}'s kernels on it (not supported by AMD; inceptionlab never sets it)")
        lines.append(f"or install a torch built for {arch} (AMD's ROCm wheels list their archs; a source build "
                     f"takes PYTORCH_ROCM_ARCH={arch})")
        return Check(name, "fail", "\n".join(lines))
    return Check(name, "fail", (
        f"{arch} is not among the archs {this_torch} has kernels for ({built}): every GPU kernel fails with 'no "
        f"kernel image is available for execution on the device'; install a torch built for {arch}: a newer CUDA "
        "wheel, `make clean setup TORCH_INDEX=.../whl/cuXYZ` (pytorch.org/get-started/locally lists which)"))


# --------------------------------------------------------------------------- /dev/shm for DataLoader workers


def shm_check(probes: SystemProbes) -> Check:
    """Is /dev/shm big enough for the guide's loop's DataLoader workers (default count)?"""
    from inceptionlab.config import load_recipe
    from inceptionlab.data.loading.sampler import default_num_workers
    from inceptionlab.data.loading.shared_memory import MIB, shm_fix, shm_needed, workers_that_fit
    from inceptionlab.data.loading.workers import PREFETCH

    space = probes.shared_memory()
    if space is None:
        return Check("shm", "ok", "no /dev/shm here: DataLoader workers share memory another way")
    size, free = space
    guide = load_recipe("inception_v3/tiny_imagenet")
    # What a worker hands over on the guide's path: uint8 crops, 3 x crop x crop each.
    batch = guide.train.batch_size * 3 * guide.data.train_crop_size**2
    workers = default_num_workers()
    needed = shm_needed(workers, PREFETCH, batch)
    have = f"/dev/shm {size / MIB:.0f} MiB, {free / MIB:.0f} MiB free"
    loop = (f"the guide's loop ({workers} DataLoader workers x {PREFETCH} prefetched batches + 1, "
            f"{guide.train.batch_size} x 3 x {guide.data.train_crop_size}^2 uint8 = {batch / MIB:.1f} MiB each) "
            f"needs {needed / MIB:.0f} MiB")
    if free >= needed:
        return Check("shm", "ok", f"{have}: {loop}")
    fitting = workers_that_fit(workers, PREFETCH, batch, free)
    return Check("shm", "warn", (
        f"{have}, but {loop} (Docker's default is 64 MiB: too little gives 'bus error' in the workers); loaders "
        f"lower num_workers to what fits ({fitting} here) and say so; to keep them all: {shm_fix(needed)}"))


# --------------------------------------------------------------------------- inference runtimes


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


# --------------------------------------------------------------------------- GPU expectation


def gpu_evidence(probes: SystemProbes) -> list[str]:
    """Signs of GPU hardware or drivers on this host, as human-readable reasons."""
    return gpu_signs("amd", probes.exists, probes.which) + gpu_signs("nvidia", probes.exists, probes.which)


def _amd_evidence(probes: SystemProbes) -> bool:
    return bool(gpu_signs("amd", probes.exists, probes.which))


def _nvidia_evidence(probes: SystemProbes) -> bool:
    return bool(gpu_signs("nvidia", probes.exists, probes.which))


def gpu_vendor(build: BuildInfo, gpu_count: int, probes: SystemProbes) -> str | None:
    """Whose GPU this machine has: the one torch sees, else the one its hardware signs point to."""
    if gpu_count:
        return "amd" if build.kind == "rocm" else "nvidia"
    amd, nvidia = _amd_evidence(probes), _nvidia_evidence(probes)
    return "amd" if amd and not nvidia else "nvidia" if nvidia and not amd else None


def no_gpu_causes(build: BuildInfo, probes: SystemProbes) -> list[str]:
    """The usual reasons torch sees no GPU on a host that should have one, most specific first."""
    causes = _build_causes(build, probes)
    causes += _visibility_causes(probes)
    causes += _permission_causes(probes)
    if build.kind == "rocm":
        causes.append(
            "the GPU's gfx arch may be unsupported by this ROCm build: `rocminfo | grep gfx` shows it; "
            "e.g. HSA_OVERRIDE_GFX_VERSION=10.3.0 (RDNA2) or 11.0.0 (RDNA3) makes it use a supported one"
        )
    if build.kind == "cuda":
        causes.append(
            f"the NVIDIA driver is missing, not loaded, or too old for CUDA {build.cuda}: run nvidia-smi"
        )
    return causes


def _build_causes(build: BuildInfo, probes: SystemProbes) -> list[str]:
    if build.kind == "cpu":
        return [
            f"torch {torch.__version__} is a CPU-only wheel (torch.version.cuda and torch.version.hip "
            "are both None): install the CUDA or ROCm build from https://pytorch.org/get-started/locally/"
        ]
    if build.kind == "cuda" and _amd_evidence(probes) and not _nvidia_evidence(probes):
        return [f"this host looks AMD (ROCm) but torch is a CUDA {build.cuda} build: install the ROCm build"]
    if build.kind == "rocm" and _nvidia_evidence(probes) and not _amd_evidence(probes):
        return [f"this host looks NVIDIA but torch is a ROCm (HIP {build.hip}) build: install the CUDA build"]
    return []


def _visibility_causes(probes: SystemProbes) -> list[str]:
    causes = []
    for var in VISIBILITY_VARS:
        value = probes.env.get(var)
        if value is None:
            continue
        if value.strip() in ("", "-1"):
            causes.append(f"{var}={value!r} hides every GPU: unset it")
        else:
            causes.append(f"{var}={value!r} is set: check that it names existing devices")
    return causes


def _permission_causes(probes: SystemProbes) -> list[str]:
    nodes = [p for p in (*AMD_DEVICE_FILES, *NVIDIA_DEVICE_FILES) if probes.exists(p)]
    nodes += sorted(probes.glob_paths(RENDER_NODES_GLOB))
    denied = [p for p in nodes if not probes.accessible(p)]
    if not denied:
        return []
    return [f"no read/write access to {', '.join(denied)}: {_access_fix(probes.user_groups(), probes.account_groups())}"]


def setup_fix(build: BuildInfo, probes: SystemProbes) -> str | None:
    """`make clean setup TORCH_FROM_SYSTEM=1` / `TORCH_INDEX=...` when this torch build cannot use the
    host's GPU; None when the build is right or there is no GPU hardware to use."""
    amd, nvidia = _amd_evidence(probes), _nvidia_evidence(probes)
    if not (amd or nvidia):
        return None  # checked first: probing the system torch costs a 2-10 s import
    this_torch = TorchInfo(torch.__version__, hip=build.hip, cuda=build.cuda)
    return suggest_fix(this_torch, probes.system_torch(), amd=amd, nvidia=nvidia, rocm=probes.rocm_version())


def gpu_visibility_check(
    expect_gpu: bool, gpu_count: int, build: BuildInfo, probes: SystemProbes, fix: str | None = None
) -> Check:
    evidence = gpu_evidence(probes)
    if gpu_count:
        return Check("gpu", "ok", f"{gpu_count} visible to torch")
    if not expect_gpu and not evidence:
        detail = "none visible, none expected (no /dev/kfd, /dev/nvidia0, amd-smi, rocm-smi, rocminfo or nvidia-smi)"
        return Check("gpu", "ok", detail)
    why = ["--expect-gpu was given"] if expect_gpu else []
    why += evidence
    lines = [f"GPU expected ({'; '.join(why)}) but torch sees none"]
    if fix:
        lines.append(f"fix: {fix}")
    torch_says = probes.gpu_init_error() if build.kind != "cpu" else None
    if torch_says:
        lines.append(f"torch says: {torch_says}")
    lines.append("possible causes:")
    lines += [f"- {cause}" for cause in no_gpu_causes(build, probes)]
    ruled_out = ruled_out_causes(build, probes)
    if ruled_out:
        lines.append(f"ruled out: {'; '.join(ruled_out)}")
    return Check("gpu", "fail", "\n".join(lines))


def ruled_out_causes(build: BuildInfo, probes: SystemProbes) -> list[str]:
    """Usual causes that were checked and are not the problem, so nobody chases them."""
    ruled_out = []
    if build.kind != "cpu":
        ruled_out.append(f"not a CPU-only wheel ({build.describe()})")
    if not any(var in probes.env for var in VISIBILITY_VARS):
        ruled_out.append(f"no {'/'.join(VISIBILITY_VARS)} set")
    if not _permission_causes(probes):
        ruled_out.append("GPU device files (if any) are readable and writable")
    return ruled_out


# --------------------------------------------------------------------------- the whole run


def run_doctor(
    expect_gpu: bool = False,
    probes: SystemProbes | None = None,
    build: BuildInfo | None = None,
    train: TrainCheckSettings | None = None,
) -> DoctorReport:
    """Run every check, and with `train` settings also train a small CNN on every device;
    `probes` and `build` are injectable for tests."""
    probes = probes or SystemProbes()
    build = build or BuildInfo.from_torch()
    tv_check, tv_version = torchvision_check(torch.__version__)
    checks = [python_check(), torch_check(build), tv_check, build_check(build)]

    case = make_conv_case()
    cpu_entry, cpu_checks, cpu_reference = _cpu_device(case)
    checks += cpu_checks
    checks.append(tools_check(probes))
    access = gpu_access_check(probes)
    if access is not None:
        checks.append(access)

    gpu_count = probes.gpu_count()
    gpu_missing = not gpu_count and (expect_gpu or bool(gpu_evidence(probes)))
    fix = setup_fix(build, probes) if gpu_missing else None
    checks.append(gpu_visibility_check(expect_gpu, gpu_count, build, probes, fix))
    devices = [cpu_entry]
    arch_list = probes.arch_list() if gpu_count else []
    for index in range(gpu_count):
        checks.append(arch_check(f"cuda:{index}", probes.gpu_arch(index), arch_list, build, probes.env))
        entry, gpu_checks = _gpu_device(index, build, case, cpu_reference)
        devices.append(entry)
        checks += gpu_checks
    checks.append(shm_check(probes))
    checks += runtime_checks(probes, gpu_vendor(build, gpu_count, probes))
    if train is not None:
        from inceptionlab.doctor_train import train_checks  # only when asked: it loads scikit-learn's digits

        checks += [Check(name, status, detail) for name, status, detail in train_checks(devices, train)]

    return DoctorReport(
        python=platform.python_version(),
        torch=torch.__version__,
        torchvision=tv_version,
        build=build,
        devices=devices,
        checks=checks,
        fix=fix,
    )


def _cpu_device(case: ConvCase) -> tuple[dict[str, Any], list[Check], ConvResult | None]:
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


def _gpu_device(
    index: int, build: BuildInfo, case: ConvCase, cpu_reference: ConvResult | None
) -> tuple[dict[str, Any], list[Check]]:
    device = f"cuda:{index}"
    try:
        entry = describe_gpu(index, build)
    except Exception as exc:
        entry = {"type": build.kind, "device": device, "index": index, "error": _one_line(exc)}
        return entry, [Check(device, "fail", f"cannot query the device: {_one_line(exc)}")]
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
