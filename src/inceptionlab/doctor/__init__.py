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

The modules, one concern each: `report` (Check, BuildInfo, DoctorReport), `probes` (SystemProbes and the
signs of GPU hardware), `versions`, `kernels` (the Conv2d check), `devices` (each device's entry),
`access` (monitoring tools, AMD device access), `arch` (GPU arch vs torch's kernels), `visibility` (a GPU
expected but not seen: causes and the set-up fix), `shm`, `inference_runtimes`, `run` (the whole run);
`train_check` (`--train-check`) and `speed` (the speed-settings table) are imported only where used.
"""

from inceptionlab.doctor.access import (
    AMD_SMI_INSTALL,
    CONTAINER_DEVICES,
    GPU_GROUPS,
    GPU_TOOLS,
    RENDER_NODES_GLOB,
    access_fix,
    gpu_access_check,
    tools_check,
)
from inceptionlab.doctor.arch import GFX_OVERRIDES, arch_check, arch_runs, gfx_override
from inceptionlab.doctor.devices import cpu_bf16_autocast, cpu_device, describe_gpu, format_gpu, gpu_device
from inceptionlab.doctor.inference_runtimes import runtime_checks
from inceptionlab.doctor.kernels import (
    FP32_ATOL,
    FP32_RTOL,
    Comparison,
    ConvCase,
    ConvResult,
    compare_conv_results,
    cpu_kernel_check,
    gpu_kernel_check,
    ieee_fp32,
    kernel_entry,
    make_conv_case,
    run_conv,
)
from inceptionlab.doctor.probes import SystemProbes, amd_evidence, gpu_evidence, nvidia_evidence
from inceptionlab.doctor.report import BuildInfo, Check, DoctorReport, Status, one_line
from inceptionlab.doctor.run import run_doctor
from inceptionlab.doctor.shm import shm_check
from inceptionlab.doctor.versions import build_check, python_check, torch_check, torchvision_check
from inceptionlab.doctor.visibility import (
    VISIBILITY_VARS,
    gpu_vendor,
    gpu_visibility_check,
    no_gpu_causes,
    ruled_out_causes,
    setup_fix,
)

__all__ = [
    "AMD_SMI_INSTALL", "CONTAINER_DEVICES", "FP32_ATOL", "FP32_RTOL", "GFX_OVERRIDES", "GPU_GROUPS", "GPU_TOOLS",
    "RENDER_NODES_GLOB", "VISIBILITY_VARS", "BuildInfo", "Check", "Comparison", "ConvCase", "ConvResult",
    "DoctorReport", "Status", "SystemProbes", "access_fix", "amd_evidence", "arch_check", "arch_runs", "build_check",
    "compare_conv_results", "cpu_bf16_autocast", "cpu_device", "cpu_kernel_check", "describe_gpu", "format_gpu",
    "gfx_override", "gpu_access_check", "gpu_device", "gpu_evidence", "gpu_kernel_check", "gpu_vendor",
    "gpu_visibility_check", "ieee_fp32", "kernel_entry", "make_conv_case", "no_gpu_causes", "nvidia_evidence",
    "one_line", "python_check", "ruled_out_causes", "run_conv", "run_doctor", "runtime_checks", "setup_fix",
    "shm_check", "tools_check", "torch_check", "torchvision_check",
]
