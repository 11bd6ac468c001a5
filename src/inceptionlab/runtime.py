"""One home for where code runs: the device resolver, seeding, the autocast table, the environment record.

Training, evaluation, predict, bench and serve all ask here, so `--device cuda:1` means the same
thing everywhere and `env.json` and bench rows describe a machine with the same schema.
"""

from __future__ import annotations

import contextlib
import os
import random
from typing import Any

import numpy as np
import torch

from inceptionlab import host
from inceptionlab.errors import UserError

DEVICE_HELP = "auto, cpu, cuda or cuda:N (a ROCm GPU is 'cuda' too)"

# Precision name -> autocast dtype (None: plain fp32). The one table training, bench and serve use.
AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(name: str, local_rank: int | None = None) -> torch.device:
    """auto | cpu | cuda | cuda:N -> a torch.device, or a UserError saying how to fix it.

    Under torchrun, plain `cuda` (or `auto` on a GPU machine) means this process's local GPU.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name!r}: use {DEVICE_HELP}") from None
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"--device {name!r}: use {DEVICE_HELP}")
    if device.type == "cuda":
        _check_gpu(name, device)
        if device.index is None and local_rank is not None:
            device = torch.device("cuda", local_rank)
    return device


def _check_gpu(name: str, device: torch.device) -> None:
    if not torch.cuda.is_available():
        raise UserError(f"--device {name}: no GPU is visible to PyTorch; run `inceptionlab doctor` or use --device cpu")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise UserError(f"--device {name}: only {count} GPU(s) visible (cuda:0..cuda:{count - 1})")


def autocast(device: torch.device | str, precision: str) -> contextlib.AbstractContextManager:
    dtype = AUTOCAST_DTYPES[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    # Set both ways: the flag is process-wide, and a later run in the same process (a notebook, the
    # tests) must not inherit an earlier run's deterministic mode. Only when it changes: the call
    # imports torch._inductor (1.8 s of one core on an AMD EPYC), which session.py otherwise imports
    # in the background while the data is read.
    if deterministic or torch.are_deterministic_algorithms_enabled():
        torch.use_deterministic_algorithms(deterministic, warn_only=True)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # cudnn.benchmark and TF32 are set per run by hardware.gpu_settings (on for NVIDIA, off for MIOpen's
    # exhaustive search on ROCm), not switched here for the whole process.


def cpu_capability() -> str:
    try:
        return torch.backends.cpu.get_cpu_capability()
    except Exception:  # older torch or exotic platform
        return "unknown"


def environment(device: torch.device | str, world_size: int = 1,
                gpu_settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The machine and software a figure was measured on: env.json and every bench row.

    `host.environment()` (the load generator's record, torch-free) plus what only torch knows, and the
    cuDNN autotuner and TF32 per precision the command applied (hardware.backends.record; None on a CPU).
    """
    device = torch.device(device)
    return {
        **host.environment(),
        "build": _torch_build(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else host.cpu_model_name(),
        "cpu_capability": cpu_capability(),
        # oneDNN's own answer (it honours ONEDNN_MAX_CPU_ISA): bf16 autocast is native, not emulated.
        "cpu_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()) if torch.backends.mkldnn.is_available() else False,
        "torch_threads": torch.get_num_threads(),
        "world_size": world_size,
        "gpu_settings": gpu_settings,
    }


def _torch_build() -> str:
    if getattr(torch.version, "hip", None):
        return f"rocm {torch.version.hip}"
    if torch.version.cuda:
        return f"cuda {torch.version.cuda}"
    return "cpu"
