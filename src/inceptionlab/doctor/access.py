"""GPU monitoring tools and, with AMD hardware, access to /dev/kfd and the render nodes (groups, a new
login, a container's --device flags)."""

from __future__ import annotations

from inceptionlab.doctor.probes import SystemProbes, amd_evidence, nvidia_evidence
from inceptionlab.doctor.report import Check
from inceptionlab.torch_build import AMD_DEVICE_FILES

# Monitoring tools, preferred first: amd-smi replaces rocm-smi ("AMD SMI will replace rocm_smi_lib over
# time. We recommend that users transition to AMD SMI": ROCm SMI's documentation; ROCm 7's TheRock
# builds no longer ship it).
GPU_TOOLS = ("amd-smi", "rocm-smi", "nvidia-smi", "rocminfo")
AMD_SMI_INSTALL = "`sudo apt install amd-smi-lib` (AMD's ROCm packages; `dnf` on RHEL)"
RENDER_NODES_GLOB = "/dev/dri/renderD*"
GPU_GROUPS = ("render", "video")
CONTAINER_DEVICES = "docker run --device=/dev/kfd --device=/dev/dri --group-add video --group-add render"


def tools_check(probes: SystemProbes) -> Check:
    """Which GPU monitoring tools exist, the one to use, and what to install where one is missing."""
    found = {tool: probes.which(tool) for tool in GPU_TOOLS}
    listing = ", ".join(f"{tool} {path}" if path else f"{tool} absent" for tool, path in found.items())
    notes, status = [], "ok"
    if found["amd-smi"]:
        notes.append("monitor AMD GPUs with amd-smi")
    elif found["rocm-smi"]:
        notes.append(f"only rocm-smi, which is deprecated (amd-smi replaces it): install amd-smi, {AMD_SMI_INSTALL}")
    elif amd_evidence(probes):
        status = "warn"
        notes.append(f"AMD GPU hardware but no amd-smi to monitor it: {AMD_SMI_INSTALL}")
    if found["nvidia-smi"]:
        notes.append("monitor NVIDIA GPUs with nvidia-smi")
    elif nvidia_evidence(probes):
        status = "warn"
        notes.append("NVIDIA GPU hardware but no nvidia-smi: it comes with the driver's utilities "
                     "(`sudo apt install nvidia-utils-<driver branch>`)")
    return Check("tools", status, "; ".join([listing, *notes]))


def gpu_access_check(probes: SystemProbes) -> Check | None:
    """With AMD hardware (or ROCm tools) present: /dev/kfd and the render nodes exist and are readable
    and writable; if not, the exact fix (groups, a new login, the container's --device flags)."""
    if not amd_evidence(probes):
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
    return Check("gpu access", "fail", f"no read/write access to {', '.join(denied)}: {access_fix(groups, probes.account_groups())}")


def access_fix(active: frozenset[str], account: frozenset[str]) -> str:
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
