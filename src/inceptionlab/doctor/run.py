"""The whole run: every check in order, and with `train` settings a small CNN trained on every device."""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING

import torch

from inceptionlab.doctor.access import gpu_access_check, tools_check
from inceptionlab.doctor.arch import arch_check
from inceptionlab.doctor.devices import cpu_device, gpu_device
from inceptionlab.doctor.inference_runtimes import runtime_checks
from inceptionlab.doctor.kernels import make_conv_case
from inceptionlab.doctor.probes import SystemProbes, gpu_evidence
from inceptionlab.doctor.report import BuildInfo, Check, DoctorReport
from inceptionlab.doctor.shm import shm_check
from inceptionlab.doctor.train_check import train_checks
from inceptionlab.doctor.versions import build_check, python_check, torch_check, torchvision_check
from inceptionlab.doctor.visibility import gpu_vendor, gpu_visibility_check, setup_fix

if TYPE_CHECKING:
    from inceptionlab.doctor.train_check import TrainCheckSettings


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
    cpu_entry, cpu_checks, cpu_reference = cpu_device(case)
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
        entry, gpu_checks = gpu_device(index, build, case, cpu_reference)
        devices.append(entry)
        checks += gpu_checks
    checks.append(shm_check(probes))
    checks += runtime_checks(probes, gpu_vendor(build, gpu_count, probes))
    if train is not None:
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
