"""`make setup`'s decision: reuse the system's GPU torch, a given wheel index, or today's pins.

Hosts are simulated with TorchInfo values and with a fake `torch` package that an interpreter
imports through PYTHONPATH (a ROCm build reporting a HIP version), so every branch runs on a CPU.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.page_examples import check_example

from inceptionlab.torch_build import TorchInfo, probe_torch, rocm_version, suggest_fix

REPO = Path(__file__).resolve().parents[1]
PLANNER = REPO / "tools" / "setup_plan.py"  # a make-time tool, outside the package
sys.path.insert(0, str(PLANNER.parent))
from setup_plan import PlanError, SetupOptions, VenvState, execute, main, make_plan  # noqa: E402
ROCM_TORCH = TorchInfo("2.7.1+rocm6.4.1.git1234", hip="6.4.43482", cuda=None, gpu_count=2, torchvision="0.22.1+rocm6.4")
CUDA_TORCH = TorchInfo("2.6.0a0+ecf3bae40a.nv25.01", cuda="12.8", gpu_count=1, torchvision="0.20.0a0")
CUDA_WHEEL_NO_GPU = TorchInfo("2.14.1+cu130", cuda="13.0", gpu_count=0, torchvision="0.29.1+cu130")
CPU_TORCH = TorchInfo("2.14.1+cpu", torchvision="0.29.1+cpu")
OPTS = SetupOptions(venv=".venv", python="/usr/bin/python3")
INDEX = "https://example.invalid/whl/rocm6.4"


def commands(plan):
    return [list(c) for c in plan.commands]


# --------------------------------------------------------------------------- the plan


def test_plain_machine_gets_exactly_the_old_makefile_commands():
    # The Makefile before this change ran these four commands (venv, pip, pins, package + pins).
    plan = make_plan(OPTS, system=None, existing=None)

    assert plan.mode == "default" and not plan.system_site_packages
    assert plan.shell_lines() == [
        "/usr/bin/python3 -m venv .venv",
        ".venv/bin/python -m pip install -q --upgrade pip",
        ".venv/bin/python -m pip install -q torch==2.14.1 torchvision==0.29.1",
        ".venv/bin/python -m pip install -q -e '.[test,demo]' torch==2.14.1 torchvision==0.29.1",
    ]


def test_existing_venv_is_reused_not_recreated():
    plan = make_plan(OPTS, system=None, existing=VenvState(system_site_packages=False))

    assert not any("venv" in cmd for cmd in commands(plan))
    assert commands(plan)[0] == [".venv/bin/python", "-m", "pip", "install", "-q", "--upgrade", "pip"]


def test_system_rocm_torch_is_reused_and_never_reinstalled():
    plan = make_plan(OPTS, system=ROCM_TORCH, existing=None)

    assert plan.mode == "system" and plan.system_site_packages
    assert commands(plan)[0] == ["/usr/bin/python3", "-m", "venv", "--system-site-packages", ".venv"]
    pip_args = [arg for cmd in commands(plan) if "pip" in cmd for arg in cmd]
    assert not [a for a in pip_args if a.startswith(("torch", "--index-url"))]
    assert "ROCm build, HIP 6.4.43482" in plan.reason
    # The last command fails the set-up if pip swapped the system torch for another one.
    check = commands(plan)[-1]
    assert check[:2] == [".venv/bin/python", "-c"] and f"\"{ROCM_TORCH.version}\"" in check[2]


def test_rocm_build_is_reused_even_when_no_gpu_is_visible_at_setup_time():
    # e.g. a `docker build` step: the package index's wheel would be a CUDA build, worse on AMD.
    no_gpu_yet = TorchInfo("2.7.1+rocm6.4", hip="6.4", gpu_count=0, torchvision="0.22.1")

    plan = make_plan(OPTS, system=no_gpu_yet, existing=None)

    assert plan.mode == "system"


def test_cuda_build_that_sees_a_gpu_is_reused():
    assert make_plan(OPTS, system=CUDA_TORCH, existing=None).mode == "system"


@pytest.mark.parametrize("system", [CUDA_WHEEL_NO_GPU, CPU_TORCH], ids=["cuda-wheel-no-gpu", "cpu-wheel"])
def test_system_torch_without_a_usable_gpu_keeps_the_default_pins(system):
    plan = make_plan(OPTS, system=system, existing=None)

    assert plan.mode == "default"
    assert commands(plan) == commands(make_plan(OPTS, system=None, existing=None))
    assert "TORCH_FROM_SYSTEM=1 reuses it anyway" in plan.reason


def test_from_system_1_reuses_even_a_torch_that_sees_no_gpu():
    opts = SetupOptions(venv=".venv", python="/usr/bin/python3", torch_from_system="1")

    assert make_plan(opts, system=CUDA_WHEEL_NO_GPU, existing=None).mode == "system"


def test_from_system_0_ignores_a_rocm_torch():
    opts = SetupOptions(venv=".venv", python="/usr/bin/python3", torch_from_system="0")

    assert make_plan(opts, system=ROCM_TORCH, existing=None).mode == "default"


def test_wheel_index_installs_the_pins_from_it():
    pins = ("torch==2.9.1", "torchvision==0.24.1")
    opts = SetupOptions(venv="v", python="/usr/bin/python3", torch_index=INDEX, pins=pins)

    plan = make_plan(opts, system=ROCM_TORCH, existing=None)

    assert plan.mode == "index" and not plan.system_site_packages
    assert commands(plan)[2] == ["v/bin/python", "-m", "pip", "install", "-q", "--index-url", INDEX,
                                 "torch==2.9.1", "torchvision==0.24.1"]
    # The package install keeps the pins, so pip sees 2.9.1+rocm6.4 satisfies them and keeps it.
    assert commands(plan)[3][-2:] == ["torch==2.9.1", "torchvision==0.24.1"]


@pytest.mark.parametrize(
    ("opts", "system", "existing", "words"),
    [
        (SetupOptions(python="/p", torch_from_system="1"), None, None, "/p has no importable torch"),
        (SetupOptions(torch_index=INDEX, torch_from_system="1"), None, None, "contradict"),
        (SetupOptions(torch_from_system="yes"), None, None, "must be one of auto, 1, 0"),
        (OPTS, TorchInfo("2.7.1+rocm6.4", hip="6.4", torchvision=None), None, "no torchvision"),
        (OPTS, TorchInfo("2.3.1+rocm6.0", hip="6.0", torchvision="0.18.1"), None, "older than inceptionlab needs"),
        (OPTS, ROCM_TORCH, VenvState(system_site_packages=False), "make clean setup TORCH_FROM_SYSTEM=1"),
        (OPTS, None, VenvState(system_site_packages=True), "make clean setup TORCH_FROM_SYSTEM=0"),
    ],
    ids=["from-system-without-torch", "index-and-from-system", "bad-choice", "no-torchvision", "too-old",
         "isolated-venv-but-reuse", "shared-venv-but-pins"],
)
def test_impossible_set_ups_are_one_line_errors_naming_the_fix(opts, system, existing, words):
    with pytest.raises(PlanError) as err:
        make_plan(opts, system=system, existing=existing)

    assert words in str(err.value)
    assert "\n" not in str(err.value)


def test_execute_stops_at_the_first_failing_command(capsys):
    plan = make_plan(OPTS, system=None, existing=None)
    ran = []

    def fake_run(cmd):
        ran.append(cmd)
        return subprocess.CompletedProcess(cmd, 1 if len(ran) == 2 else 0)

    assert execute(plan, run=fake_run) == 1
    assert len(ran) == 2
    assert capsys.readouterr().out.splitlines() == plan.shell_lines()[:2]


# --------------------------------------------------------------------------- probing interpreters


def write_fake_torch(
    root: Path, hip: str | None, cuda: str | None, gpus: int, torchvision: bool = True, version: str = "2.7.1+fake"
) -> Path:
    """A `torch` (and `torchvision`) package that only answers the probe's questions."""
    package = root / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        f"__version__ = {version!r}\n"
        f"class version:\n    hip = {hip!r}\n    cuda = {cuda!r}\n"
        f"class cuda:\n    is_available = staticmethod(lambda: {gpus > 0})\n"
        f"    device_count = staticmethod(lambda: {gpus})\n"
    )
    if torchvision:
        (root / "torchvision").mkdir()
        (root / "torchvision" / "__init__.py").write_text("__version__ = '0.22.1+fake'\n")
    return root


def test_probe_reads_a_fake_system_rocm_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(write_fake_torch(tmp_path, hip="6.4.43482", cuda=None, gpus=1)))

    info = probe_torch(sys.executable)

    assert info == TorchInfo("2.7.1+fake", hip="6.4.43482", cuda=None, gpu_count=1, torchvision="0.22.1+fake",
                             file=str(tmp_path / "torch" / "__init__.py"))
    assert info.kind == "rocm"


def test_probe_of_the_real_interpreter_matches_this_torch():
    info = probe_torch(sys.executable)

    assert info is not None
    assert (info.version, info.cuda, info.hip) == (torch.__version__, torch.version.cuda, torch.version.hip)


def test_probe_without_torch_or_with_a_broken_interpreter_is_none(tmp_path, monkeypatch):
    (tmp_path / "torch.py").write_text("raise ImportError('libamdhip64.so: cannot open shared object file')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))

    assert probe_torch(sys.executable) is None
    assert probe_torch(str(tmp_path / "no-such-python")) is None


def test_a_system_python_without_torch_gets_the_pins_as_the_install_page_shows(tmp_path, monkeypatch, capsys):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "torch.py").write_text("raise ImportError('No module named torch')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    monkeypatch.chdir(tmp_path)  # make's VENV is .venv, in the checkout

    code = main(["--python", sys.executable, "--venv", ".venv"])

    assert code == 0
    check_example("install-setup-plan", capsys.readouterr().out)


def test_planner_with_a_fake_rocm_system_torch_plans_a_shared_venv(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", str(write_fake_torch(tmp_path / "site", hip="6.4.43482", cuda=None, gpus=1)))
    venv = tmp_path / "venv"

    code = main(["--json", "--python", sys.executable, "--venv", str(venv)])

    plan = json.loads(capsys.readouterr().out)
    assert code == 0
    assert plan["mode"] == "system" and plan["system_site_packages"] is True
    assert plan["commands"][0] == f"{sys.executable} -m venv --system-site-packages {venv}"
    assert not any("torch==" in line for line in plan["commands"])


def test_planner_refuses_a_fake_rocm_torch_without_torchvision(tmp_path, monkeypatch, capsys):
    site = write_fake_torch(tmp_path / "site", hip="6.4.43482", cuda=None, gpus=1, torchvision=False)
    monkeypatch.setenv("PYTHONPATH", str(site))

    code = main(["--python", sys.executable, "--venv", str(tmp_path / "venv")])

    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and "no torchvision" in err and err.count("\n") == 1


def test_planner_runs_on_the_bare_standard_library(tmp_path):
    # -S: no site-packages at all, as on a fresh system before `make setup` installed anything.
    done = subprocess.run(
        [sys.executable, "-S", str(PLANNER), "--torch-index", INDEX, "--venv", str(tmp_path / "v")],
        capture_output=True, text=True, timeout=60,
    )

    assert done.returncode == 0, done.stderr
    assert f"--index-url {INDEX} torch==2.14.1 torchvision==0.29.1" in done.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_passes_its_variables_to_the_planner(tmp_path):
    done = subprocess.run(
        ["make", "-s", "setup-plan", f"PYTHON={sys.executable}", f"TORCH_INDEX={INDEX}",
         "TORCH_PINS=torch==2.9.1 torchvision==0.24.1", f"VENV={tmp_path / 'v'}"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )

    assert done.returncode == 0, done.stderr
    assert f"--index-url {INDEX} torch==2.9.1 torchvision==0.24.1" in done.stdout
    assert not (tmp_path / "v").exists()  # setup-plan only prints


def test_venv_state_reads_pyvenv_cfg(tmp_path):
    for flag, name in ((["--system-site-packages"], "shared"), ([], "isolated")):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", *flag, str(tmp_path / name)], check=True)

    assert VenvState.read(str(tmp_path / "shared")) == VenvState(system_site_packages=True)
    assert VenvState.read(str(tmp_path / "isolated")) == VenvState(system_site_packages=False)
    assert VenvState.read(str(tmp_path / "absent")) is None


@pytest.mark.parametrize(("text", "expected"), [("6.4.1-120\n", "6.4"), ("7.0.0", "7.0"), ("garbage", None)])
def test_rocm_version_file(tmp_path, text, expected):
    (tmp_path / "version").write_text(text)

    assert rocm_version(str(tmp_path / "version")) == expected
    assert rocm_version(str(tmp_path / "absent")) is None


# --------------------------------------------------------------------------- doctor's fix


VENV_CPU = TorchInfo("2.14.1+cpu")
VENV_CUDA_WHEEL = TorchInfo("2.14.1+cu130", cuda="13.0")


def test_fix_for_a_venv_that_hides_the_system_rocm_torch():
    fix = suggest_fix(VENV_CPU, system_torch=ROCM_TORCH, amd=True, nvidia=False, rocm="6.4")

    assert fix.startswith("`make clean setup TORCH_FROM_SYSTEM=1`")
    assert "HIP 6.4.43482" in fix and "hidden by this venv's own torch 2.14.1+cpu (CPU-only build)" in fix


def test_fix_for_a_non_rocm_wheel_on_an_amd_host_names_the_rocm_index():
    fix = suggest_fix(VENV_CUDA_WHEEL, system_torch=None, amd=True, nvidia=False, rocm="6.4")

    assert fix.startswith("`make clean setup TORCH_INDEX=.../whl/rocm6.4`")
    assert "ROCm 6.4 is installed here" in fix


def test_fix_without_a_known_rocm_version_says_where_to_look():
    fix = suggest_fix(VENV_CPU, system_torch=CPU_TORCH, amd=True, nvidia=False, rocm=None)

    assert "TORCH_INDEX=.../whl/rocmX.Y" in fix and "/opt/rocm/.info/version" in fix


def test_fix_for_a_cpu_wheel_on_an_nvidia_host_names_a_cuda_index():
    fix = suggest_fix(VENV_CPU, system_torch=None, amd=False, nvidia=True)

    assert fix.startswith("`make clean setup TORCH_INDEX=.../whl/cu130`")


@pytest.mark.parametrize(
    ("venv", "system", "amd", "nvidia"),
    [
        (TorchInfo("2.7.1+rocm6.4", hip="6.4"), ROCM_TORCH, True, False),  # right build: drivers/groups instead
        (VENV_CUDA_WHEEL, CUDA_TORCH, False, True),
        (VENV_CPU, ROCM_TORCH, False, False),  # no GPU hardware here: nothing to fix
    ],
    ids=["rocm-on-amd", "cuda-on-nvidia", "no-hardware"],
)
def test_no_build_fix_when_the_build_is_not_the_problem(venv, system, amd, nvidia):
    assert suggest_fix(venv, system_torch=system, amd=amd, nvidia=nvidia, rocm="6.4") is None


def test_the_closing_check_fails_when_the_venv_torch_is_not_the_system_one(tmp_path):
    system_site = write_fake_torch(tmp_path / "system", hip="6.4.43482", cuda=None, gpus=1)
    pip_site = write_fake_torch(tmp_path / "pip", hip=None, cuda="13.0", gpus=0, version="2.14.1+cu130")
    fake_system = TorchInfo("2.7.1+fake", hip="6.4.43482", gpu_count=1, torchvision="0.22.1+fake")
    check = make_plan(OPTS, system=fake_system, existing=None).commands[-1][2]

    def run_check(site):
        env = {"PYTHONPATH": str(site)}
        return subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True)

    kept, replaced = run_check(system_site), run_check(pip_site)

    assert kept.returncode == 0, kept.stderr
    assert replaced.returncode == 1
    assert "pip replaced the system torch 2.7.1+fake by 2.14.1+cu130" in replaced.stderr


# --------------------------------------------------------------------------- the ONNX Runtime package


def package_line(plan):
    return next(cmd for cmd in commands(plan) if "-e" in cmd)


def test_cpu_machine_keeps_the_cpu_onnxruntime_inside_the_test_extra():
    plan = make_plan(OPTS, system=None, existing=None, host_gpus=frozenset(), default_build="cuda")

    assert plan.onnx_runtime.package == "onnxruntime" and plan.onnx_runtime.advice is None
    assert ".[test,demo]" in package_line(plan)


@pytest.mark.parametrize(
    ("system", "index", "host_gpus", "default_build"),
    [
        (CUDA_TORCH, "", frozenset(), "cpu"),  # NVIDIA's container: its torch sees the GPU
        (None, "", frozenset({"nvidia"}), "cuda"),  # the package index's CUDA wheel on an NVIDIA host
        (None, "https://example.invalid/whl/cu128", frozenset({"nvidia"}), "cpu"),  # TORCH_INDEX=.../cu128
    ],
    ids=["system-cuda-torch-sees-gpu", "default-cuda-wheel-nvidia-host", "cuda-index-nvidia-host"],
)
def test_torch_on_an_nvidia_gpu_gets_onnxruntime_gpu_and_never_the_cpu_package(system, index, host_gpus,
                                                                               default_build):
    opts = SetupOptions(venv=".venv", python="/usr/bin/python3", torch_index=index)

    plan = make_plan(opts, system=system, existing=None, host_gpus=host_gpus, default_build=default_build)

    assert plan.onnx_runtime.package == "onnxruntime-gpu"
    # `test` pulls the CPU-only onnxruntime through `onnx`: the plan installs the extras without it.
    assert package_line(plan)[package_line(plan).index("-e") + 1] == ".[test-base,demo,onnx-gpu]"
    assert plan.to_dict()["onnx_runtime"]["package"] == "onnxruntime-gpu"


@pytest.mark.parametrize(
    ("system", "host_gpus", "default_build"),
    [
        (None, frozenset(), "cuda"),  # a CUDA wheel, but no NVIDIA hardware: no GPU for torch
        (CUDA_WHEEL_NO_GPU, frozenset(), "cuda"),
        (None, frozenset({"nvidia"}), "cpu"),  # macOS / aarch64: the package index's wheel is a CPU build
    ],
    ids=["cuda-wheel-no-hardware", "system-cuda-wheel-no-gpu", "cpu-wheel-nvidia-host"],
)
def test_no_nvidia_gpu_for_torch_keeps_the_cpu_package(system, host_gpus, default_build):
    plan = make_plan(OPTS, system=system, existing=None, host_gpus=host_gpus, default_build=default_build)

    assert plan.onnx_runtime.package == "onnxruntime"
    assert "onnx-gpu" not in " ".join(plan.shell_lines())


def test_rocm_torch_keeps_the_cpu_package_and_prints_the_migraphx_command():
    plan = make_plan(OPTS, system=ROCM_TORCH, existing=None, host_gpus=frozenset({"amd"}), rocm="6.4")

    runtime = plan.onnx_runtime
    assert runtime.package == "onnxruntime"
    assert "onnxruntime-migraphx" in runtime.advice and "ROCm 6.4" in runtime.advice
    assert ".venv/bin/python -m pip uninstall -y onnxruntime" in runtime.advice
    # Printed, never run: no command of the plan installs from AMD's index or names MIGraphX.
    assert "migraphx" not in " ".join(plan.shell_lines())


def test_rocm_index_is_treated_like_a_rocm_torch():
    opts = SetupOptions(venv="v", python="/usr/bin/python3", torch_index=INDEX)

    assert "onnxruntime-migraphx" in make_plan(opts, system=None, existing=None).onnx_runtime.advice


def test_a_hand_installed_migraphx_build_is_kept_and_the_cpu_package_removed():
    existing = VenvState(system_site_packages=True, packages=frozenset({"onnxruntime-migraphx", "onnxruntime"}))

    plan = make_plan(OPTS, system=ROCM_TORCH, existing=existing)

    assert plan.onnx_runtime.package == "onnxruntime-migraphx" and plan.onnx_runtime.advice is None
    assert [".venv/bin/python", "-m", "pip", "uninstall", "-q", "-y", "onnxruntime"] in commands(plan)
    assert ".[test-base,demo]" in package_line(plan)  # no extra names an ONNX Runtime package


def test_a_reused_rocm_containers_migraphx_build_is_not_shadowed_by_the_cpu_package():
    container = TorchInfo("2.7.1+rocm6.4", hip="6.4", gpu_count=1, torchvision="0.22.1",
                          ort_packages=("onnxruntime-migraphx",))

    plan = make_plan(OPTS, system=container, existing=None)

    assert plan.onnx_runtime.package == "onnxruntime-migraphx"
    assert ".[test-base,demo]" in package_line(plan)  # no CPU onnxruntime in the venv to hide it
    assert not any("uninstall" in cmd for cmd in commands(plan))  # the system's package is not the venv's


def test_the_probe_lists_the_onnx_runtime_packages_beside_torch(tmp_path, monkeypatch):
    site = write_fake_torch(tmp_path, hip="6.4", cuda=None, gpus=1)
    (site / "onnxruntime_migraphx-1.27.1.dist-info").mkdir()
    (site / "onnxruntime_migraphx-1.27.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: onnxruntime-migraphx\nVersion: 1.27.1\n")
    monkeypatch.setenv("PYTHONPATH", str(site))

    assert "onnxruntime-migraphx" in probe_torch(sys.executable).ort_packages


def test_an_existing_venv_swaps_the_cpu_package_for_the_gpu_one_before_installing():
    existing = VenvState(system_site_packages=True, packages=frozenset({"onnxruntime"}))

    plan = make_plan(OPTS, system=CUDA_TORCH, existing=existing)

    uninstall = commands(plan).index([".venv/bin/python", "-m", "pip", "uninstall", "-q", "-y", "onnxruntime"])
    assert uninstall < commands(plan).index(package_line(plan))


@pytest.mark.parametrize(("asked", "package"), [("cpu", "onnxruntime"), ("gpu", "onnxruntime-gpu")])
def test_onnx_runtime_variable_overrides_the_choice(asked, package):
    opts = SetupOptions(venv=".venv", python="/usr/bin/python3", onnx_runtime=asked)
    system = CUDA_TORCH if asked == "cpu" else None

    assert make_plan(opts, system=system, existing=None).onnx_runtime.package == package


def test_a_bad_onnx_runtime_value_is_a_one_line_error():
    with pytest.raises(PlanError, match="ONNX_RUNTIME='rocm' must be one of auto, cpu, gpu"):
        make_plan(SetupOptions(onnx_runtime="rocm"), system=None, existing=None)


def test_venv_state_reads_the_onnx_runtime_packages_it_holds(tmp_path):
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*")) / "site-packages"
    for name in ("onnxruntime_gpu-1.31.1.dist-info", "onnx-1.23.0.dist-info", "numpy-2.1.0.dist-info"):
        (site / name).mkdir()

    assert VenvState.read(str(venv)).packages == frozenset({"onnxruntime-gpu"})


def test_pyproject_extras_keep_one_onnx_runtime_per_environment():
    try:
        import tomllib
    except ImportError:  # Python 3.10: pip's own copy of the same parser
        from pip._vendor import tomli as tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def runtimes(extra, seen=()):
        found = set()
        for requirement in extras[extra]:
            if requirement.startswith("inceptionlab["):
                for inner in requirement[len("inceptionlab["):-1].split(","):
                    found |= runtimes(inner, seen + (extra,))
            elif requirement.split(">")[0].split("=")[0] in ("onnxruntime", "onnxruntime-gpu", "onnxruntime-migraphx"):
                found.add(requirement.split(">")[0].split("=")[0])
        return found

    assert runtimes("test") == {"onnxruntime"}
    assert runtimes("test-base") == set()
    assert runtimes("onnx-gpu") == {"onnxruntime-gpu"}
    assert runtimes("test-base") | runtimes("demo") | runtimes("onnx-gpu") == {"onnxruntime-gpu"}
