"""Is a GPU expected, and does torch see it? If not, the usual causes (build, visibility variables,
permissions), the ones ruled out, and the set-up command that fixes the build."""

from __future__ import annotations

import torch

from inceptionlab.doctor.access import RENDER_NODES_GLOB, access_fix
from inceptionlab.doctor.probes import SystemProbes, amd_evidence, gpu_evidence, nvidia_evidence
from inceptionlab.doctor.report import BuildInfo, Check
from inceptionlab.torch_build import AMD_DEVICE_FILES, NVIDIA_DEVICE_FILES, TorchInfo, suggest_fix

VISIBILITY_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def gpu_vendor(build: BuildInfo, gpu_count: int, probes: SystemProbes) -> str | None:
    """Whose GPU this machine has: the one torch sees, else the one its hardware signs point to."""
    if gpu_count:
        return "amd" if build.kind == "rocm" else "nvidia"
    amd, nvidia = amd_evidence(probes), nvidia_evidence(probes)
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
    if build.kind == "cuda" and amd_evidence(probes) and not nvidia_evidence(probes):
        return [f"this host looks AMD (ROCm) but torch is a CUDA {build.cuda} build: install the ROCm build"]
    if build.kind == "rocm" and nvidia_evidence(probes) and not amd_evidence(probes):
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
    return [f"no read/write access to {', '.join(denied)}: {access_fix(probes.user_groups(), probes.account_groups())}"]


def setup_fix(build: BuildInfo, probes: SystemProbes) -> str | None:
    """`make clean setup TORCH_FROM_SYSTEM=1` / `TORCH_INDEX=...` when this torch build cannot use the
    host's GPU; None when the build is right or there is no GPU hardware to use."""
    amd, nvidia = amd_evidence(probes), nvidia_evidence(probes)
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
