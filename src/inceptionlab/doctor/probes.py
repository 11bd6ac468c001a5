"""Everything the doctor learns from the host (`SystemProbes`), replaceable in tests, and the signs of GPU
hardware it reads from them."""

from __future__ import annotations

import glob
import os
import shutil
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

try:  # POSIX only: without a group database there are no groups to check
    import grp
    import pwd
except ImportError:  # pragma: no cover - not POSIX
    grp = pwd = None  # type: ignore[assignment]

import torch

from inceptionlab.host import shared_memory_space
from inceptionlab.infer.runtimes import ort_installed_providers
from inceptionlab.torch_build import TorchInfo, base_interpreter, gpu_signs, probe_torch, rocm_version


def _read_write_access(path: str) -> bool:
    return os.access(path, os.R_OK | os.W_OK)


def _current_user_groups() -> frozenset[str]:
    # os.getgroups() is the *process's* groups: after `usermod -aG render` they only appear
    # after a new login, which is exactly the state we want to diagnose.
    if grp is None:  # not POSIX
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
    if grp is None or pwd is None:  # not POSIX
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


def gpu_evidence(probes: SystemProbes) -> list[str]:
    """Signs of GPU hardware or drivers on this host, as human-readable reasons."""
    return gpu_signs("amd", probes.exists, probes.which) + gpu_signs("nvidia", probes.exists, probes.which)


def amd_evidence(probes: SystemProbes) -> bool:
    return bool(gpu_signs("amd", probes.exists, probes.which))


def nvidia_evidence(probes: SystemProbes) -> bool:
    return bool(gpu_signs("nvidia", probes.exists, probes.which))
