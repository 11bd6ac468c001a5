"""Process-wide GPU settings of a run: cuDNN's autotuner and TF32 (torch.backends flags)."""

from __future__ import annotations

import contextlib
from typing import Iterator

from inceptionlab.hardware.facts import DeviceFacts


def cudnn_benchmark(facts: DeviceFacts) -> bool:
    """cuDNN's autotuner on NVIDIA (fixed shapes); off on ROCm, where it makes MIOpen run an
    exhaustive search for every new shape (ROCm/pytorch#1851)."""
    return facts.kind == "cuda"


@contextlib.contextmanager
def gpu_settings(facts: DeviceFacts, precision: str, deterministic: bool = False) -> Iterator[None]:
    """cudnn.benchmark and TF32 for one run, restored afterwards (they are process-wide flags).

    TF32 for fp32 training on sm_80+ (10-bit mantissa in the matmul units, fp32 range): torch's
    default is IEEE fp32 for matmuls, which leaves Ampere's tensor cores idle.
    """
    import torch

    if not facts.is_gpu:
        yield
        return
    benchmark = cudnn_benchmark(facts) and not deterministic
    matmul = torch.backends.cuda.matmul
    saved_tf32 = matmul.allow_tf32
    try:
        with torch.backends.cudnn.flags(enabled=True, benchmark=benchmark, deterministic=deterministic,
                                        allow_tf32=facts.tf32 and precision == "fp32" and not deterministic):
            matmul.allow_tf32 = facts.tf32 and precision == "fp32" and not deterministic
            yield
    finally:
        matmul.allow_tf32 = saved_tf32
