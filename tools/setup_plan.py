"""How `make setup` gets torch: reuse the system's GPU build, a given wheel index, or the default pins.

A make-time tool, outside the package: `make setup` runs this file with the system interpreter
BEFORE inceptionlab is installed (`python3 tools/setup_plan.py --run`), so it uses the standard
library and, from the checkout's src/, only `inceptionlab.torch_build` (standard library too). It asks
the system interpreter, in a subprocess, which torch it has (version, torch.version.hip / cuda,
torch.cuda.is_available()), then plans the venv and pip commands:

- `system`: the system torch is a ROCm build, or a CUDA build that sees a GPU (AMD's ROCm PyTorch
  container, NVIDIA's): a venv with `--system-site-packages`; torch and torchvision are not reinstalled.
- `index`: `TORCH_INDEX=URL` (PyTorch's ROCm or CUDA wheel index): torch and torchvision from there.
- `default`: anything else, e.g. a plain CPU machine: `torch==2.14.1 torchvision==0.29.1` from the
  package index, exactly what `make setup` always did.

ONNX Runtime comes as one package per hardware target (torch_build.choose_ort_package): where the
venv's torch will use an NVIDIA GPU, `onnxruntime-gpu` (CUDA and TensorRT providers) replaces the
CPU-only `onnxruntime` that the `onnx` extra (inside `test`) names: the package is installed with the
same extras minus the CPU runtime (`test-base`, `onnx-export`) plus `onnx-gpu`. On ROCm the plan keeps
the CPU package and prints the command for AMD's `onnxruntime-migraphx`, which AMD publishes per ROCm
release outside the package index. `ONNX_RUNTIME=cpu|gpu` overrides the choice.

What `inceptionlab doctor` shares with it (the probe, TorchInfo, `suggest_fix`, the ONNX Runtime
choice) lives in src/inceptionlab/torch_build.py.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

# The checkout's package, not an installed one (there is none yet when `make setup` runs).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from inceptionlab.torch_build import (ORT_CPU, ORT_PACKAGES, OrtChoice, TorchInfo, base_interpreter,  # noqa: E402
                                      choose_ort_package, gpu_signs, probe_torch, rocm_version)

DEFAULT_PINS = ("torch==2.14.1", "torchvision==0.29.1")
DEFAULT_EXTRAS = "test,demo"
FROM_SYSTEM_CHOICES = ("auto", "1", "0")
ONNX_RUNTIME_CHOICES = ("auto", "cpu", "gpu")
# Extras that name the CPU-only onnxruntime, and what stands for them without it (pyproject.toml).
WITHOUT_CPU_RUNTIME = {"test": "test-base", "onnx": "onnx-export"}
# pyproject.toml's floors (torch>=2.4, torchvision>=0.19): an older system torch would make pip
# install a second torch into the venv, which is what reusing it is meant to avoid.
MIN_TORCH = (2, 4)
MIN_TORCHVISION = (0, 19)


class PlanError(Exception):
    """The requested set-up cannot work here; the message names the fix."""


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class SetupOptions:
    venv: str = ".venv"
    python: str = sys.executable
    torch_index: str = ""  # TORCH_INDEX: a wheel index URL (ROCm / CUDA builds)
    torch_from_system: str = "auto"  # TORCH_FROM_SYSTEM: auto | 1 (always reuse) | 0 (never)
    pins: tuple[str, ...] = DEFAULT_PINS  # TORCH_PINS
    extras: str = DEFAULT_EXTRAS
    onnx_runtime: str = "auto"  # ONNX_RUNTIME: auto | cpu | gpu (onnxruntime-gpu)


@dataclass(frozen=True)
class VenvState:
    """An existing venv: does it see the system's site-packages, and which ONNX Runtime packages has it?"""

    system_site_packages: bool
    packages: frozenset[str] = frozenset()  # of ORT_PACKAGES, those installed in the venv itself

    @classmethod
    def read(cls, venv: str) -> VenvState | None:
        python = Path(venv) / "bin" / "python"
        if not os.access(python, os.X_OK):
            return None
        packages = _installed_ort_packages(Path(venv))
        try:
            cfg = (Path(venv) / "pyvenv.cfg").read_text()
        except OSError:
            return cls(system_site_packages=False, packages=packages)
        for line in cfg.splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "include-system-site-packages":
                return cls(system_site_packages=value.strip().lower() == "true", packages=packages)
        return cls(system_site_packages=False, packages=packages)


def _installed_ort_packages(venv: Path) -> frozenset[str]:
    """ONNX Runtime distributions in the venv's site-packages, from their .dist-info folder names
    ("onnxruntime_gpu-1.31.1.dist-info" -> "onnxruntime-gpu"), without running its interpreter."""
    names = set()
    for info in venv.glob("lib/python*/site-packages/*.dist-info"):
        names.add(re.sub(r"[-_.]+", "-", info.name.removesuffix(".dist-info").rsplit("-", 1)[0]).lower())
    return frozenset(names & set(ORT_PACKAGES))


@dataclass(frozen=True)
class SetupPlan:
    mode: str  # system | index | default
    reason: str
    system_site_packages: bool
    commands: tuple[tuple[str, ...], ...]
    onnx_runtime: OrtChoice = OrtChoice(ORT_CPU, "")

    def shell_lines(self) -> list[str]:
        return [shlex.join(cmd) for cmd in self.commands]

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "reason": self.reason,
            "system_site_packages": self.system_site_packages,
            "commands": self.shell_lines(),
            "onnx_runtime": {"package": self.onnx_runtime.package, "reason": self.onnx_runtime.reason,
                             "advice": self.onnx_runtime.advice},
        }


def _version_tuple(version: str) -> tuple[int, ...]:
    """Leading numeric release of a version: '2.7.0a0+git1234' -> (2, 7, 0)."""
    numbers = []
    for part in version.split("+")[0].split("."):
        digits = ""
        for char in part:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        numbers.append(int(digits))
        if len(digits) != len(part):
            break
    return tuple(numbers)


def choose_source(opts: SetupOptions, system: TorchInfo | None) -> tuple[str, str]:
    """(mode, reason): where torch comes from."""
    if opts.torch_from_system not in FROM_SYSTEM_CHOICES:
        raise PlanError(f"TORCH_FROM_SYSTEM={opts.torch_from_system!r} must be one of {', '.join(FROM_SYSTEM_CHOICES)}")
    if opts.torch_index and opts.torch_from_system == "1":
        raise PlanError("TORCH_INDEX and TORCH_FROM_SYSTEM=1 contradict each other: give one of them")
    if opts.torch_index:
        return "index", f"TORCH_INDEX given: {' '.join(opts.pins)} from {opts.torch_index}"
    if opts.torch_from_system == "0":
        return "default", f"TORCH_FROM_SYSTEM=0: {' '.join(opts.pins)} from the package index"
    if opts.torch_from_system == "1":
        if system is None:
            raise PlanError(
                f"TORCH_FROM_SYSTEM=1 but {opts.python} has no importable torch: "
                "install one there, or drop TORCH_FROM_SYSTEM (or give TORCH_INDEX=URL)"
            )
        return "system", f"TORCH_FROM_SYSTEM=1: reusing {opts.python}'s {system.describe()}"
    if system is None:
        return "default", f"{opts.python} has no torch: {' '.join(opts.pins)} from the package index"
    if system.kind == "rocm" or (system.kind == "cuda" and system.gpu_count > 0):
        # A ROCm build is never worse than the package index's wheel, which is a CUDA build.
        return "system", f"reusing {opts.python}'s {system.describe()}"
    return "default", (
        f"{opts.python}'s {system.describe()} is not a GPU build that sees a GPU: "
        f"{' '.join(opts.pins)} from the package index (TORCH_FROM_SYSTEM=1 reuses it anyway)"
    )


def _check_reusable(system: TorchInfo, python: str) -> None:
    if system.torchvision is None:
        raise PlanError(
            f"{python} has torch {system.version} but no torchvision: install the torchvision built for that "
            "torch there, or set up without it (TORCH_FROM_SYSTEM=0, or TORCH_INDEX=URL)"
        )
    if _version_tuple(system.version)[:2] < MIN_TORCH or _version_tuple(system.torchvision)[:2] < MIN_TORCHVISION:
        floor = f"torch>={'.'.join(map(str, MIN_TORCH))}, torchvision>={'.'.join(map(str, MIN_TORCHVISION))}"
        raise PlanError(
            f"{python}'s torch {system.version} / torchvision {system.torchvision} is older than inceptionlab "
            f"needs ({floor}): upgrade it, or set up without it (TORCH_FROM_SYSTEM=0, or TORCH_INDEX=URL)"
        )


def _check_existing_venv(opts: SetupOptions, existing: VenvState | None, want_system: bool) -> None:
    if existing is None or existing.system_site_packages == want_system:
        return
    has = "sees" if existing.system_site_packages else "does not see"
    fix = "TORCH_FROM_SYSTEM=1" if want_system else "TORCH_FROM_SYSTEM=0"
    raise PlanError(
        f"{opts.venv} exists and {has} the system's site-packages, but this set-up needs the opposite: "
        f"`make clean setup {fix}` recreates it"
    )


def wheel_build(index: str) -> str | None:
    """What a PyTorch wheel index serves, from its last path part: rocm, cuda or cpu (None: unknown)."""
    tail = index.rstrip("/").rsplit("/", 1)[-1].lower()
    if tail.startswith("rocm"):
        return "rocm"
    if re.fullmatch(r"cu\d+", tail):
        return "cuda"
    return "cpu" if tail == "cpu" else None


def default_wheel_build(system: str = platform.system(), machine: str = platform.machine()) -> str:
    """The package index's torch wheels are CUDA builds on Linux x86_64 (2.14.1+cu130), CPU builds elsewhere."""
    return "cuda" if system == "Linux" and machine in ("x86_64", "AMD64") else "cpu"


def torch_gpu_vendor(mode: str, opts: SetupOptions, system: TorchInfo | None, host_gpus: frozenset[str],
                     default_build: str | None = None) -> str | None:
    """Whose GPU the venv's torch will use: "nvidia", "amd" or None.

    A reused system torch says so itself (a ROCm build, or a CUDA build that sees a GPU); a torch still
    to be installed is judged by its build (the index's, or the package index's) and the host's signs
    of NVIDIA hardware (/dev/nvidia0, nvidia-smi): a CUDA wheel on a machine without them uses no GPU.
    """
    if mode == "system" and system is not None:
        if system.kind == "rocm":
            return "amd"
        return "nvidia" if system.kind == "cuda" and (system.gpu_count or "nvidia" in host_gpus) else None
    build = wheel_build(opts.torch_index) if mode == "index" else (default_build or default_wheel_build())
    if build == "rocm":
        return "amd"
    return "nvidia" if build == "cuda" and "nvidia" in host_gpus else None


def package_extras(extras: str, runtime: OrtChoice) -> str:
    """`extras` for the chosen ONNX Runtime: unchanged for the CPU package; else without the extras
    that name the CPU package, plus the chosen one's extra (none for a hand-installed MIGraphX build)."""
    names = [name for name in extras.split(",") if name]
    if runtime.package == ORT_CPU:
        return ",".join(names)
    names = [WITHOUT_CPU_RUNTIME.get(name, name) for name in names]
    if runtime.extra and any(name in WITHOUT_CPU_RUNTIME.values() for name in names):
        names.append(runtime.extra)
    return ",".join(dict.fromkeys(names))


def make_plan(opts: SetupOptions, system: TorchInfo | None, existing: VenvState | None,
              host_gpus: frozenset[str] = frozenset(), rocm: str | None = None,
              default_build: str | None = None) -> SetupPlan:
    """The commands that set up `opts.venv`; pure, so every branch is unit-tested.

    `host_gpus`: the vendors whose GPU hardware the host shows ("amd", "nvidia"); `rocm`: the installed
    ROCm version (for the MIGraphX advice); `default_build`: the package index wheel's build (tests).
    """
    mode, reason = choose_source(opts, system)
    if opts.onnx_runtime not in ONNX_RUNTIME_CHOICES:
        raise PlanError(f"ONNX_RUNTIME={opts.onnx_runtime!r} must be one of {', '.join(ONNX_RUNTIME_CHOICES)}")
    want_system = mode == "system"
    if want_system:
        _check_reusable(system, opts.python)
    _check_existing_venv(opts, existing, want_system)
    py = str(Path(opts.venv) / "bin" / "python")
    pip = (py, "-m", "pip", "install", "-q")
    gpu = torch_gpu_vendor(mode, opts, system, host_gpus, default_build)
    in_venv = existing.packages if existing else frozenset()
    # A reused system Python's own ONNX Runtime build (AMD's containers ship onnxruntime-migraphx) counts too.
    visible = in_venv | (frozenset(system.ort_packages) if want_system and system else frozenset())
    runtime = choose_ort_package(gpu, python=py, rocm=rocm, asked=opts.onnx_runtime, installed=visible)
    extras = package_extras(opts.extras, runtime)
    package = f".[{extras}]" if extras else "."
    commands: list[tuple[str, ...]] = []
    if existing is None:
        flags = ("--system-site-packages",) if want_system else ()
        commands.append((opts.python, "-m", "venv", *flags, opts.venv))
    commands.append((*pip, "--upgrade", "pip"))
    others = sorted(in_venv - {runtime.package})  # pip removes only what the venv itself holds
    if others:
        # Two ONNX Runtime packages share one `onnxruntime` module: the other one goes first.
        commands.append((py, "-m", "pip", "uninstall", "-q", "-y", *others))
    if mode == "system":
        # No torch pins: pip finds the system torch/torchvision satisfy pyproject's floors and
        # leaves them alone; the last command proves it did.
        commands.append((*pip, "-e", package))
        commands.append((py, "-c", _same_torch_check(system)))
    elif mode == "index":
        commands.append((*pip, "--index-url", opts.torch_index, *opts.pins))
        commands.append((*pip, "-e", package, *opts.pins))
    else:
        commands.append((*pip, *opts.pins))
        commands.append((*pip, "-e", package, *opts.pins))
    return SetupPlan(mode, reason, want_system, tuple(commands), runtime)


def _same_torch_check(system: TorchInfo) -> str:
    # Double quotes only, so the shell form that `make setup-plan` prints stays readable.
    return (
        f'import sys, torch; v = torch.__version__; sys.exit(0 if v == "{system.version}" else '
        f'f"pip replaced the system torch {system.version} by {{v}}: run `make clean setup TORCH_FROM_SYSTEM=0` '
        f'or report the dependency that asked for it")'
    )


# --------------------------------------------------------------------------- command line


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="setup_plan.py",
        description="Plan (and with --run, do) `make setup`: which torch the venv gets, and how.",
    )
    parser.add_argument("--venv", default=".venv")
    parser.add_argument("--python", default=None, help="system interpreter (default: the one running this)")
    parser.add_argument("--torch-index", default="", help="TORCH_INDEX: wheel index URL for ROCm/CUDA builds")
    parser.add_argument("--torch-from-system", default="auto", help="TORCH_FROM_SYSTEM: auto | 1 | 0")
    parser.add_argument("--pins", default=" ".join(DEFAULT_PINS), help="TORCH_PINS: torch/torchvision requirements")
    parser.add_argument("--extras", default=DEFAULT_EXTRAS)
    parser.add_argument("--onnx-runtime", default="auto", help="ONNX_RUNTIME: auto | cpu | gpu (onnxruntime-gpu)")
    parser.add_argument("--run", action="store_true", help="execute the commands (default: print them)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    return parser.parse_args(argv)


def options_from_args(args: argparse.Namespace) -> SetupOptions:
    return SetupOptions(
        venv=args.venv,
        python=args.python or base_interpreter(),
        torch_index=args.torch_index.strip(),
        torch_from_system=args.torch_from_system.strip() or "auto",
        pins=tuple(args.pins.split()) or DEFAULT_PINS,
        extras=args.extras,
        onnx_runtime=args.onnx_runtime.strip() or "auto",
    )


def host_gpu_vendors() -> frozenset[str]:
    """The vendors whose GPU hardware or drivers this host shows (torch_build.gpu_signs)."""
    return frozenset(vendor for vendor in ("amd", "nvidia") if gpu_signs(vendor))


def execute(plan: SetupPlan, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> int:
    for command in plan.commands:
        print(shlex.join(command), flush=True)  # echoed like make echoes its recipe lines
        code = run(list(command)).returncode
        if code != 0:
            return code
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    opts = options_from_args(args)
    try:
        # With an index given, the system torch does not matter: skip the 2-10 s import.
        system = None if opts.torch_index or opts.torch_from_system == "0" else probe_torch(opts.python)
        plan = make_plan(opts, system, VenvState.read(opts.venv), host_gpu_vendors(), rocm_version())
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
        return 0
    print(f"setup: {plan.mode}: {plan.reason}", flush=True)
    print(f"setup: {plan.onnx_runtime.package}: {plan.onnx_runtime.reason}", flush=True)
    code = execute(plan) if args.run else 0
    if not args.run:
        print("\n".join(plan.shell_lines()))
    if plan.onnx_runtime.advice and code == 0:
        print(f"note: {plan.onnx_runtime.advice}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
