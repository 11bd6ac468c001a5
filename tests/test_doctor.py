"""`inceptionlab doctor`: the real run on this machine, and simulated hosts via injected probes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from inceptionlab.doctor import (
    BuildInfo,
    SystemProbes,
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


def fake_probes(
    files: tuple[str, ...] = (),
    tools: tuple[str, ...] = (),
    render_nodes: tuple[str, ...] = (),
    accessible: bool = True,
    groups: frozenset[str] = frozenset({"users"}),
    env: dict[str, str] | None = None,
    system_torch: TorchInfo | None = None,
    rocm: str | None = None,
) -> SystemProbes:
    """A host with exactly these device files, tools and groups, on which torch sees no GPU."""
    present = set(files) | set(render_nodes)
    return SystemProbes(
        exists=lambda path: path in present,
        which=lambda tool: f"/usr/bin/{tool}" if tool in tools else None,
        glob_paths=lambda pattern: list(render_nodes) if pattern.startswith("/dev/dri/") else [],
        accessible=lambda path: accessible,
        user_groups=lambda: groups,
        env=env or {},
        gpu_count=lambda: 0,
        gpu_init_error=lambda: None,
        system_torch=lambda: system_torch,
        rocm_version=lambda: rocm,
    )


ROCM_BUILD = BuildInfo(cuda=None, hip="6.4.43482")
CUDA_BUILD = BuildInfo(cuda="13.0", hip=None)
CPU_BUILD = BuildInfo(cuda=None, hip=None)


def check(report, name):
    return next(c for c in report.checks if c.name == name)


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


def test_cpu_venv_hiding_the_system_rocm_torch_names_the_make_fix():
    # AMD's ROCm container: the system Python has a ROCm torch, the venv installed a CPU-only one.
    system = TorchInfo("2.7.1+rocm6.4.1", hip="6.4.43482", gpu_count=1, torchvision="0.22.1")
    probes = fake_probes(files=("/dev/kfd",), tools=("rocminfo",), system_torch=system, rocm="6.4")

    report = run_doctor(probes=probes, build=CPU_BUILD)

    gpu = check(report, "gpu")
    assert gpu.status == "fail"
    assert gpu.detail.splitlines()[1].startswith("fix: `make clean setup TORCH_FROM_SYSTEM=1`")
    assert report.to_dict()["fix"].startswith("`make clean setup TORCH_FROM_SYSTEM=1`")


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
