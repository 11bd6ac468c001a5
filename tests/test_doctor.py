"""`inceptionlab doctor`: the real run on this machine, and simulated hosts via injected probes."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
import torch
from helpers.page_examples import check_example

from inceptionlab.doctor import (
    BuildInfo,
    Check,
    SystemProbes,
    arch_check,
    arch_runs,
    compare_conv_results,
    cpu_kernel_check,
    gpu_evidence,
    ieee_fp32,
    make_conv_case,
    run_conv,
    run_doctor,
    torchvision_check,
)
from inceptionlab.torch_build import TorchInfo

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="asserts behaviour when torch sees no GPU")
# With /dev/kfd, nvidia-smi etc. present but no GPU visible, failing is the right answer.
needs_no_gpu_hardware = pytest.mark.skipif(
    torch.cuda.is_available() or bool(gpu_evidence(SystemProbes())),
    reason="asserts a healthy report on a host with no GPU and no GPU hardware evidence",
)


ROOMY_SHM = (8 * 2**30, 8 * 2**30)
CPU_RUNTIMES = {"onnxruntime": ["CPUExecutionProvider"], "openvino": ["CPU"]}


def fake_probes(
    files: tuple[str, ...] = (),
    tools: tuple[str, ...] = (),
    render_nodes: tuple[str, ...] = (),
    accessible: bool = True,
    groups: frozenset[str] = frozenset({"users"}),
    env: dict[str, str] | None = None,
    system_torch: TorchInfo | None = None,
    rocm: str | None = None,
    account_groups: frozenset[str] | None = None,
    gpus: int = 0,
    arch: str | None = None,
    arch_list: tuple[str, ...] = (),
    shm: tuple[int, int] | None = ROOMY_SHM,
    runtimes: dict[str, list[str] | None] | None = None,
) -> SystemProbes:
    """A host with exactly these device files, tools, groups, /dev/shm and runtimes; torch sees `gpus`
    GPUs of `arch` (none by default) and was built for `arch_list`."""
    present = set(files) | set(render_nodes)
    return SystemProbes(
        exists=lambda path: path in present,
        which=lambda tool: f"/usr/bin/{tool}" if tool in tools else None,
        glob_paths=lambda pattern: list(render_nodes) if pattern.startswith("/dev/dri/") else [],
        accessible=lambda path: accessible,
        user_groups=lambda: groups,
        env=env or {},
        gpu_count=lambda: gpus,
        gpu_init_error=lambda: None,
        system_torch=lambda: system_torch,
        rocm_version=lambda: rocm,
        account_groups=lambda: groups if account_groups is None else account_groups,
        gpu_arch=lambda index: arch,
        arch_list=lambda: list(arch_list),
        shared_memory=lambda: shm,
        runtime_targets=lambda: dict(CPU_RUNTIMES if runtimes is None else runtimes),
    )


ROCM_BUILD = BuildInfo(cuda=None, hip="6.4.43482")
CUDA_BUILD = BuildInfo(cuda="13.0", hip=None)
CPU_BUILD = BuildInfo(cuda=None, hip=None)


def check(report, name):
    return next(c for c in report.checks if c.name == name)


def printed(found) -> str:
    """A check as `inceptionlab doctor` prints it."""
    from inceptionlab.cli.doctor import format_check

    return "\n".join(format_check(found.status, found.name, found.detail))


def names(report):
    return [c.name for c in report.checks]


# --------------------------------------------------------------------------- the real CLI


@needs_no_gpu_hardware
def test_json_on_this_cpu_machine_is_healthy(cli):
    result = cli("doctor", "--json")

    assert result.code == 0, result.out + result.err
    data = json.loads(result.out)  # exactly one JSON object, nothing else on stdout
    assert data["ok"] is True
    assert data["torch"] == torch.__version__
    assert data["build"]["cuda"] == torch.version.cuda
    cpu = [d for d in data["devices"] if d["type"] == "cpu"]
    assert len(cpu) == 1
    assert cpu[0]["kernel"]["status"] == "ok"
    assert cpu[0]["capability"] == torch.backends.cpu.get_cpu_capability()
    assert [d for d in data["devices"] if d["type"] != "cpu"] == []
    assert {c["status"] for c in data["checks"]} <= {"ok", "warn"}
    assert all(set(c) == {"name", "status", "detail"} for c in data["checks"])


@needs_no_gpu_hardware
def test_human_output_is_aligned_and_ends_with_verdict(cli):
    result = cli("doctor")

    assert result.code == 0
    lines = result.out.splitlines()
    assert lines[-1].startswith("healthy:")
    torch_line = next(line for line in lines if line.split()[1:2] == ["torch"])
    assert torch_line.startswith("ok    torch            ")
    assert torch.__version__ in torch_line


@needs_no_gpu
def test_expect_gpu_fails_and_names_the_gpu_check(cli):
    result = cli("doctor", "--expect-gpu")

    assert result.code == 1
    assert result.out.splitlines()[-1] == "unhealthy: 1 failing check(s): gpu"
    assert "fail  gpu" in result.out
    assert "--expect-gpu was given" in result.out
    if torch.version.cuda or torch.version.hip:
        # A CUDA/ROCm wheel with no GPU: the cause is the driver or visibility, not the wheel.
        assert "CPU-only wheel" not in result.out.split("ruled out:")[0]
        assert "not a CPU-only wheel" in result.out
        assert "driver" in result.out or "HSA_OVERRIDE_GFX_VERSION" in result.out
        assert "VISIBLE_DEVICES" in result.out
    else:
        assert "CPU-only wheel" in result.out


@needs_no_gpu
def test_expect_gpu_json_is_one_object_with_ok_false(cli):
    result = cli("doctor", "--json", "--expect-gpu")

    assert result.code == 1
    data = json.loads(result.out)
    assert data["ok"] is False
    assert [c["name"] for c in data["checks"] if c["status"] == "fail"] == ["gpu"]


def test_help_has_an_example(cli):
    result = cli("doctor", "--help")

    assert result.code == 0
    assert "inceptionlab doctor --expect-gpu" in result.out


# --------------------------------------------------------------------------- simulated hosts


def test_amd_hardware_without_visible_gpu_lists_rocm_causes():
    probes = fake_probes(files=("/dev/kfd",), render_nodes=("/dev/dri/renderD128",), accessible=False)

    report = run_doctor(probes=probes, build=ROCM_BUILD)

    gpu = check(report, "gpu")
    assert gpu.status == "fail"
    assert not report.ok
    assert "/dev/kfd exists" in gpu.detail
    assert "HSA_OVERRIDE_GFX_VERSION" in gpu.detail
    assert "render" in gpu.detail and "video" in gpu.detail
    assert "/dev/dri/renderD128" in gpu.detail
    assert "CPU-only wheel" not in gpu.detail.split("ruled out:")[0]
    assert [d["type"] for d in report.devices] == ["cpu"]


def test_accessible_device_files_are_not_blamed():
    probes = fake_probes(files=("/dev/kfd",), accessible=True, groups=frozenset({"render", "video"}))

    gpu = check(run_doctor(probes=probes, build=ROCM_BUILD), "gpu")

    assert gpu.status == "fail"
    assert "usermod" not in gpu.detail
    assert "device files (if any) are readable" in gpu.detail


def test_cpu_only_wheel_is_named_as_the_cause():
    probes = fake_probes(files=("/dev/nvidia0",), tools=("nvidia-smi",))

    gpu = check(run_doctor(probes=probes, build=CPU_BUILD), "gpu")

    assert gpu.status == "fail"
    causes = gpu.detail.split("possible causes:")[1]
    assert "CPU-only wheel" in causes
    assert "torch.version.cuda and torch.version.hip are both None" in causes


def test_cpu_only_wheel_with_expect_gpu_and_no_hardware_evidence():
    gpu = check(run_doctor(expect_gpu=True, probes=fake_probes(), build=CPU_BUILD), "gpu")

    assert gpu.status == "fail"
    assert "CPU-only wheel" in gpu.detail


@pytest.mark.parametrize("value", ["", "-1"])
def test_hidden_by_visible_devices_variable(value):
    probes = fake_probes(files=("/dev/nvidia0",), env={"CUDA_VISIBLE_DEVICES": value})

    gpu = check(run_doctor(probes=probes, build=CUDA_BUILD), "gpu")

    assert gpu.status == "fail"
    assert f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU" in gpu.detail
    assert "driver" in gpu.detail


def test_cuda_wheel_on_amd_host_is_called_a_mismatch():
    gpu = check(run_doctor(probes=fake_probes(files=("/dev/kfd",)), build=CUDA_BUILD), "gpu")

    assert "install the ROCm build" in gpu.detail
    with_rocm = fake_probes(files=("/dev/kfd",), tools=("rocminfo",), rocm="6.4")
    on_rocm_host = check(run_doctor(probes=with_rocm, build=CUDA_BUILD), "gpu")
    check_example("troubleshooting-cuda-wheel-on-amd", printed(on_rocm_host))


def test_cpu_venv_hiding_the_system_rocm_torch_names_the_make_fix():
    # AMD's ROCm container: the system Python has a ROCm torch, the venv installed a CPU-only one.
    system = TorchInfo("2.7.1+rocm6.4.1", hip="6.4.43482", gpu_count=1, torchvision="0.22.1")
    probes = fake_probes(files=("/dev/kfd",), tools=("rocminfo",), system_torch=system, rocm="6.4")

    report = run_doctor(probes=probes, build=CPU_BUILD)

    gpu = check(report, "gpu")
    assert gpu.status == "fail"
    assert gpu.detail.splitlines()[1].startswith("fix: `make clean setup TORCH_FROM_SYSTEM=1`")
    assert report.to_dict()["fix"].startswith("`make clean setup TORCH_FROM_SYSTEM=1`")
    check_example("troubleshooting-rocm-torch-hidden", printed(gpu))


def test_cpu_wheel_on_amd_host_names_the_rocm_wheel_index():
    probes = fake_probes(files=("/dev/kfd",), rocm="6.4")

    report = run_doctor(probes=probes, build=CPU_BUILD)

    assert "fix: `make clean setup TORCH_INDEX=.../whl/rocm6.4`" in check(report, "gpu").detail
    assert "TORCH_INDEX=.../whl/rocm6.4" in report.fix


def test_right_build_gets_no_set_up_fix():
    system = TorchInfo("2.7.1+rocm6.4.1", hip="6.4.43482", gpu_count=0, torchvision="0.22.1")
    probes = fake_probes(files=("/dev/kfd",), accessible=False, system_torch=system, rocm="6.4")

    report = run_doctor(probes=probes, build=ROCM_BUILD)

    assert report.fix is None and report.to_dict()["fix"] is None
    assert "fix:" not in check(report, "gpu").detail
    assert "usermod" in check(report, "gpu").detail  # the real cause is still named


def test_no_evidence_and_not_expected_is_ok():
    report = run_doctor(probes=fake_probes(), build=CPU_BUILD)

    assert check(report, "gpu").status == "ok"
    assert report.ok


def test_torch_reason_is_quoted_when_it_gives_one():
    probes = replace(fake_probes(files=("/dev/nvidia0",)), gpu_init_error=lambda: "Found no NVIDIA driver")

    gpu = check(run_doctor(probes=probes, build=CUDA_BUILD), "gpu")

    assert "torch says: Found no NVIDIA driver" in gpu.detail


def test_torchvision_import_failure_is_a_failing_check():
    def broken_import(name):
        raise RuntimeError("operator torchvision::nms does not exist")

    result, version = torchvision_check("2.14.1+cu130", importer=broken_import)

    assert version is None
    assert result.status == "fail"
    assert "install the torchvision that matches torch 2.14.1+cu130" in result.detail
    assert "torchvision::nms" in result.detail


@pytest.mark.parametrize(
    ("torchvision_version", "status"),
    [("0.29.1+cu130", "ok"), ("0.29.1+cpu", "warn"), ("0.28.0+cu130", "warn"), ("0.29.1", "ok")],
)
def test_torchvision_pairing(torchvision_version, status):
    class FakeTorchvision:
        __version__ = torchvision_version

    result, version = torchvision_check("2.14.1+cu130", importer=lambda name: FakeTorchvision)

    assert version == torchvision_version
    assert result.status == status


# --------------------------------------------------------------------------- kernel comparison


def test_cpu_kernel_matches_double_precision_reference():
    comparison, fp32 = cpu_kernel_check(make_conv_case())

    assert comparison.ok, comparison.detail
    assert fp32 is not None and fp32.output.shape == (2, 8, 16, 16)
    assert fp32.weight_grad.shape == (8, 3, 3, 3)
    assert 0 < comparison.max_abs_diff < 1e-4


def test_comparison_detects_a_perturbed_output():
    case = make_conv_case()
    reference = run_conv(case, "cpu", torch.float64)
    good = run_conv(case, "cpu", torch.float32)
    bad_output = good.output.clone()
    bad_output[0, 0, 0, 0] += 0.01  # one wrong value out of 4096
    bad = replace(good, output=bad_output)

    assert compare_conv_results(good, reference).ok
    result = compare_conv_results(bad, reference)
    assert not result.ok
    assert "output" in result.detail
    assert result.max_abs_diff >= 0.009


def test_comparison_detects_a_wrong_weight_gradient_and_nan():
    case = make_conv_case()
    reference = run_conv(case, "cpu", torch.float64)
    good = run_conv(case, "cpu", torch.float32)

    scaled = replace(good, weight_grad=good.weight_grad * 1.01)
    nan = replace(good, bias_grad=torch.full_like(good.bias_grad, float("nan")))

    assert "weight_grad" in compare_conv_results(scaled, reference).detail
    assert not compare_conv_results(scaled, reference).ok
    assert "non-finite" in compare_conv_results(nan, reference).detail


def test_conv_case_is_deterministic_and_leaves_global_rng_alone():
    state = torch.get_rng_state()
    first, second = make_conv_case(seed=3), make_conv_case(seed=3)

    assert torch.equal(first.inputs, second.inputs)
    assert torch.equal(first.weight, second.weight)
    assert torch.equal(torch.get_rng_state(), state)


def test_ieee_fp32_restores_the_callers_tf32_settings():
    conv, matmul = torch.backends.cudnn.conv, torch.backends.cuda.matmul
    before = (conv.fp32_precision, matmul.fp32_precision)

    with ieee_fp32():
        assert (conv.fp32_precision, matmul.fp32_precision) == ("ieee", "ieee")

    assert (conv.fp32_precision, matmul.fp32_precision) == before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_gpu_devices_are_reported_with_a_passing_kernel():
    report = run_doctor()

    gpus = [d for d in report.devices if d["type"] != "cpu"]
    assert len(gpus) == torch.cuda.device_count()
    for gpu in gpus:
        assert gpu["kernel"]["status"] == "ok", gpu["kernel"]["detail"]
        assert gpu["total_memory_gib"] > 0
        assert gpu["compute_capability"] or gpu["gfx_arch"]


# --------------------------------------------------------------------------- monitoring tools


def test_amd_smi_is_preferred_when_both_amd_tools_exist():
    tools = check(run_doctor(probes=fake_probes(tools=("amd-smi", "rocm-smi")), build=CPU_BUILD), "tools")

    assert tools.status == "ok"
    assert "monitor AMD GPUs with amd-smi" in tools.detail and "deprecated" not in tools.detail


def test_only_rocm_smi_is_called_deprecated_with_the_amd_smi_install():
    tools = check(run_doctor(probes=fake_probes(tools=("rocm-smi",)), build=CPU_BUILD), "tools")

    assert "only rocm-smi, which is deprecated (amd-smi replaces it)" in tools.detail
    assert "sudo apt install amd-smi-lib" in tools.detail


@pytest.mark.parametrize(("files", "missing"), [(("/dev/kfd",), "no amd-smi"), (("/dev/nvidia0",), "no nvidia-smi")])
def test_gpu_hardware_without_its_monitoring_tool_warns(files, missing):
    tools = check(run_doctor(probes=fake_probes(files=files), build=CPU_BUILD), "tools")

    assert tools.status == "warn" and missing in tools.detail


# --------------------------------------------------------------------------- AMD device access

AMD_FILES = {"files": ("/dev/kfd",), "render_nodes": ("/dev/dri/renderD128",), "tools": ("amd-smi",)}


def test_accessible_amd_devices_pass_the_access_check():
    probes = fake_probes(**AMD_FILES, groups=frozenset({"render", "video"}))

    access = check(run_doctor(probes=probes, build=ROCM_BUILD), "gpu access")

    assert access.status == "ok"
    assert "/dev/kfd, /dev/dri/renderD128 readable and writable (groups: render, video)" == access.detail


def test_no_amd_hardware_means_no_access_check():
    assert "gpu access" not in names(run_doctor(probes=fake_probes(files=("/dev/nvidia0",)), build=CUDA_BUILD))


def test_denied_devices_outside_the_groups_name_usermod():
    probes = fake_probes(**AMD_FILES, accessible=False, groups=frozenset({"users", "video"}))

    access = check(run_doctor(probes=probes, build=ROCM_BUILD), "gpu access")

    assert access.status == "fail"
    assert "no read/write access to /dev/kfd, /dev/dri/renderD128" in access.detail
    assert "you are not in the render group(s): `sudo usermod -aG render,video $USER`" in access.detail


def test_groups_added_but_not_yet_in_this_login_ask_for_a_new_login():
    probes = fake_probes(**AMD_FILES, accessible=False, groups=frozenset({"users"}),
                         account_groups=frozenset({"users", "render", "video"}))

    access = check(run_doctor(probes=probes, build=ROCM_BUILD), "gpu access")

    assert "you were added to render/video but this login predates it" in access.detail
    assert "newgrp render" in access.detail and "usermod" not in access.detail


def test_denied_despite_the_groups_blames_the_files_permissions():
    probes = fake_probes(**AMD_FILES, accessible=False, groups=frozenset({"render", "video"}))

    access = check(run_doctor(probes=probes, build=ROCM_BUILD), "gpu access")

    assert "files' own permissions are wrong" in access.detail and "usermod" not in access.detail


def test_rocm_tools_without_the_device_files_name_the_container_flags():
    probes = fake_probes(tools=("rocminfo", "amd-smi"))  # a ROCm container started without --device

    access = check(run_doctor(probes=probes, build=ROCM_BUILD), "gpu access")

    assert access.status == "fail"
    assert access.detail.startswith("/dev/kfd and /dev/dri/renderD* missing")
    assert "--device=/dev/kfd --device=/dev/dri --group-add video --group-add render" in access.detail


# --------------------------------------------------------------------------- GPU arch vs torch's arch list

ROCM_ARCHS = ("gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx1030", "gfx1100", "gfx1101", "gfx1102")
CUDA_ARCHS = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")


@pytest.mark.parametrize(
    ("arch", "family", "value", "sibling"),
    [("gfx1031", "RDNA2", "10.3.0", "gfx1030"), ("gfx1032", "RDNA2", "10.3.0", "gfx1030"),
     ("gfx1103", "RDNA3", "11.0.0", "gfx1100")],
)
def test_missing_gfx_arch_suggests_the_familys_override_but_never_sets_it(arch, family, value, sibling):
    env: dict[str, str] = {}
    probes = fake_probes(**AMD_FILES, gpus=1, arch=arch, arch_list=ROCM_ARCHS, env=env)

    report = run_doctor(probes=probes, build=ROCM_BUILD)

    found = check(report, "arch cuda:0")
    assert found.status == "fail" and not report.ok
    assert f"{arch} is not among the archs torch {torch.__version__} (ROCm build, HIP 6.4.43482)" in found.detail
    assert "invalid device function" in found.detail and "gfx1100" in found.detail  # the list is named
    assert f"{arch} is {family}: `export HSA_OVERRIDE_GFX_VERSION={value}`" in found.detail
    assert f"runs {sibling}'s kernels" in found.detail and "inceptionlab never sets it" in found.detail
    assert env == {} and "HSA_OVERRIDE_GFX_VERSION" not in os.environ
    assert names(report).index("arch cuda:0") < names(report).index("cuda:0")
    if arch == "gfx1031":
        # The fake ROCm build reports this torch's version; the page's host had the ROCm wheel's.
        check_example("troubleshooting-gfx-arch", printed(found).replace(torch.__version__, "2.7.1+rocm6.4"))


def test_a_gfx_arch_without_a_known_override_names_the_build_to_install():
    found = arch_check("cuda:0", "gfx1010", list(ROCM_ARCHS), ROCM_BUILD, {})

    assert found.status == "fail"
    assert "HSA_OVERRIDE_GFX_VERSION" not in found.detail
    assert "install a torch built for gfx1010" in found.detail and "PYTORCH_ROCM_ARCH=gfx1010" in found.detail


def test_an_override_already_set_is_reported_not_suggested_again():
    found = arch_check("cuda:0", "gfx1031", list(ROCM_ARCHS), ROCM_BUILD, {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"})

    assert "HSA_OVERRIDE_GFX_VERSION=10.3.0 is set, yet ROCm reports gfx1031" in found.detail
    assert "export HSA_OVERRIDE" not in found.detail


def test_a_listed_gfx_arch_with_target_features_passes():
    assert arch_check("cuda:0", "gfx90a", ["gfx90a:xnack-", "gfx942"], ROCM_BUILD, {}).status == "ok"


@pytest.mark.parametrize(
    ("arch", "arch_list", "runs"),
    [
        ("sm_86", CUDA_ARCHS, "sm_86"),
        ("sm_89", CUDA_ARCHS, "sm_86"),  # same major, lower minor: binary compatible
        ("sm_120", CUDA_ARCHS, None),  # Blackwell on a build that stops at Hopper
        ("sm_120", (*CUDA_ARCHS, "compute_90"), "compute_90"),  # PTX, compiled at first use
        ("sm_90", ("sm_80", "sm_90a"), "sm_90a"),  # arch-specific cubins run on that exact GPU only
        ("sm_100", ("sm_80", "sm_90a"), None),
        ("sm_75", ("sm_80", "sm_90"), None),  # never a higher minor or major
        ("gfx942", ROCM_ARCHS, "gfx942"),
        ("gfx1031", ROCM_ARCHS, None),  # no compatibility across gfx targets
    ],
)
def test_arch_runs(arch, arch_list, runs):
    assert arch_runs(arch, list(arch_list)) == runs


def test_a_missing_sm_arch_is_the_no_kernel_image_failure():
    found = arch_check("cuda:0", "sm_120", list(CUDA_ARCHS), CUDA_BUILD, {})

    assert found.status == "fail"
    assert "no kernel image is available" in found.detail and "sm_120" in found.detail
    assert "TORCH_INDEX=.../whl/cuXYZ" in found.detail and "HSA_OVERRIDE" not in found.detail
    assert arch_check("cuda:0", "sm_89", list(CUDA_ARCHS), CUDA_BUILD, {}).detail == \
        "sm_89: runs this torch's sm_86 (binary-compatible kernels)"


# --------------------------------------------------------------------------- /dev/shm


def test_dockers_64_mib_shm_warns_with_the_flags_that_fix_it():
    report = run_doctor(probes=fake_probes(shm=(64 * 2**20, 64 * 2**20)), build=CPU_BUILD)

    shm = check(report, "shm")
    assert shm.status == "warn" and report.ok  # loaders cope by themselves; a warning, not a failure
    assert shm.detail.startswith("/dev/shm 64 MiB, 64 MiB free, but the guide's loop")
    assert "32 x 3 x 299^2 uint8 = 8.2 MiB each" in shm.detail
    assert "lower num_workers to what fits" in shm.detail
    assert "docker run --shm-size=1g" in shm.detail and "--ipc=host" in shm.detail


def test_roomy_or_absent_shm_is_ok():
    assert check(run_doctor(probes=fake_probes(), build=CPU_BUILD), "shm").status == "ok"
    absent = check(run_doctor(probes=fake_probes(shm=None), build=CPU_BUILD), "shm")
    assert absent.status == "ok" and "no /dev/shm" in absent.detail


# --------------------------------------------------------------------------- inference runtimes


def test_an_nvidia_gpu_with_the_cpu_only_onnxruntime_names_onnxruntime_gpu():
    probes = fake_probes(files=("/dev/nvidia0",), tools=("nvidia-smi",), gpus=1, arch="sm_86", arch_list=CUDA_ARCHS)

    ort = check(run_doctor(probes=probes, build=CUDA_BUILD), "onnxruntime")

    assert ort.status == "warn"
    assert "providers: CPUExecutionProvider" in ort.detail
    assert "-m pip uninstall -y onnxruntime &&" in ort.detail and "-m pip install onnxruntime-gpu" in ort.detail


def test_cuda_and_tensorrt_providers_on_an_nvidia_gpu_are_ok():
    runtimes = {"onnxruntime": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
                "openvino": ["CPU"]}
    probes = fake_probes(files=("/dev/nvidia0",), gpus=1, arch="sm_86", arch_list=CUDA_ARCHS, runtimes=runtimes)

    report = run_doctor(probes=probes, build=CUDA_BUILD)

    assert check(report, "onnxruntime") == Check(
        "onnxruntime", "ok", "providers: TensorrtExecutionProvider, CUDAExecutionProvider, CPUExecutionProvider")
    assert check(report, "openvino").detail == "devices: CPU; OpenVINO runs on CPUs and Intel GPUs only"


def test_amd_hardware_with_the_cpu_only_onnxruntime_names_the_migraphx_build():
    probes = fake_probes(**AMD_FILES, rocm="6.4")

    ort = check(run_doctor(probes=probes, build=ROCM_BUILD), "onnxruntime")

    assert ort.status == "warn"
    assert "no MIGraphX provider" in ort.detail and "onnxruntime-migraphx" in ort.detail and "ROCm 6.4" in ort.detail


def test_no_gpu_and_no_runtimes_installed_is_ok():
    report = run_doctor(probes=fake_probes(runtimes={"onnxruntime": None, "openvino": None}), build=CPU_BUILD)

    assert check(report, "onnxruntime").status == check(report, "openvino").status == "ok"
    assert "not installed" in check(report, "onnxruntime").detail
