"""What a device has units for, from its properties alone: the CPU/GPU fact tables (each row with its
source) and `DeviceFacts`, the probe's answer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceFacts:
    """What the probe knows about one device, without timing anything.

    kind: cpu | cuda (NVIDIA) | rocm (AMD). arch: the CPU's ATen capability (AVX2, AVX512, ...), an
    NVIDIA compute capability as "sm_80", or an AMD gfx target as "gfx90a".
    """

    kind: str
    name: str
    arch: str
    bf16: bool  # native bf16 arithmetic (CPU: oneDNN's check; GPU: the tables below)
    fp16: bool  # fp16 worth training in (tensor/matrix cores and fast kernels)
    amx: bool = False
    tf32: bool = False
    notes: tuple[str, ...] = ()

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("cuda", "rocm")

    def describe(self) -> str:
        units = [name for name, has in (("bf16", self.bf16), ("fp16", self.fp16), ("AMX", self.amx),
                                        ("TF32", self.tf32)) if has]
        return f"{self.name} ({self.arch}; {', '.join(units) or 'fp32 only'})"


# --- GPUs: what each architecture has units for. One row per fact, with its source.

# NVIDIA compute capability (major, minor) from which a feature exists.
NVIDIA_BF16_FROM = (8, 0)  # bf16 tensor cores: Ampere (A100 whitepaper); T4 (7.5) and V100 (7.0) have none
NVIDIA_FP16_FROM = (7, 0)  # fp16 tensor cores: Volta; fp16 + GradScaler is the fast path on sm_70/sm_75
NVIDIA_TF32_FROM = (8, 0)  # TF32 exists from Ampere on (torch docs, "TensorFloat-32 (TF32) on Ampere")

# AMD gfx targets with bf16 matrix units. gfx90a (MI200), gfx94x (MI300), gfx95x (MI350): CDNA2+
# matrix cores (AMD CDNA2/CDNA3 ISA guides); gfx11/gfx12 (RDNA3/4): WMMA bf16 (RDNA3 ISA guide),
# kept as candidates to be measured, never assumed fast.
AMD_BF16_PREFIXES = ("gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")
# fp16 convolutions on MI250X (gfx90a) fall back to naive kernels 6.4x slower than A100 (ROCm/MIOpen#3310).
AMD_FP16_SLOW_PREFIXES = ("gfx90a",)
# channels_last: 1.3-2x faster on MI300X, badly regressed on Radeon gfx11 since ROCm 7
# (pytorch/pytorch#170947). It stays a candidate everywhere, chosen only where measured faster; where
# nothing is measured (no calibration) RDNA gets NCHW.
AMD_NHWC_UNPROVEN_PREFIXES = ("gfx10", "gfx11", "gfx12")


def gpu_facts_from(name: str, vendor: str, major: int = 0, minor: int = 0, gfx: str | None = None) -> DeviceFacts:
    """DeviceFacts of a GPU from its properties: testable with fake devices (any vendor, any arch)."""
    if vendor == "rocm":
        arch = (gfx or "gfx?").split(":")[0]  # "gfx90a:sramecc+:xnack-" -> "gfx90a"
        bf16 = arch.startswith(AMD_BF16_PREFIXES)
        fp16 = not arch.startswith(AMD_FP16_SLOW_PREFIXES)
        notes = ("fp16 convolutions use slow fallback kernels here (ROCm/MIOpen#3310)",) if not fp16 else ()
        return DeviceFacts("rocm", name, arch, bf16=bf16, fp16=fp16, notes=notes)
    capability = (major, minor)
    return DeviceFacts("cuda", name, f"sm_{major}{minor}", bf16=capability >= NVIDIA_BF16_FROM,
                       fp16=capability >= NVIDIA_FP16_FROM, tf32=capability >= NVIDIA_TF32_FROM)


def no_bf16_reason(facts: DeviceFacts) -> str:
    if facts.kind == "cpu":
        return (f"this CPU ({facts.arch}) has no bf16 units as oneDNN reports: bf16 would be emulated, "
                "10-30x slower than fp32 (AMD EPYC Zen 3)")
    if facts.kind == "cuda":
        return f"{facts.arch} has no bf16 tensor cores (sm_80 and later do): fp16 with loss scaling is its fast path"
    return f"{facts.arch} has no bf16 matrix units"
