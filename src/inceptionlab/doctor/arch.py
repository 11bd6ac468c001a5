"""Each GPU's arch against the archs this torch has kernels for, and the fix when it has none."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from inceptionlab.doctor.report import BuildInfo, Check

# HSA_OVERRIDE_GFX_VERSION makes ROCm run a sibling's kernels on a GPU this torch has none for:
# (family prefix, family, the sibling torch builds for, the value). RDNA2 gfx1031/1032/1034/1035/1036 ->
# gfx1030 (e.g. ROCm/rocALUTION#197, pytorch/pytorch#132570 on gfx1031); RDNA3 gfx1101/1102/1103 ->
# gfx1100 (ROCm/bitsandbytes#29). Not supported by AMD, and it can hang a GPU whose ISA differs too much
# (ROCm/TheRock#1184, gfx1103): suggested by name, never set.
GFX_OVERRIDES = (("gfx103", "RDNA2", "gfx1030", "10.3.0"), ("gfx110", "RDNA3", "gfx1100", "11.0.0"))


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
