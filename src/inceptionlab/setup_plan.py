"""How `make setup` gets torch: reuse the system's GPU build, a given wheel index, or the default pins.

`make setup` runs this file with the system interpreter BEFORE inceptionlab is installed
(`python3 src/inceptionlab/setup_plan.py --run`, or `PYTHONPATH=src python3 -m inceptionlab.setup_plan`),
so it uses the standard library only. It asks the system interpreter, in a subprocess, which torch it
has (version, torch.version.hip / cuda, torch.cuda.is_available()), then plans the venv and pip
commands:

- `system`: the system torch is a ROCm build, or a CUDA build that sees a GPU (AMD's ROCm PyTorch
  container, NVIDIA's): a venv with `--system-site-packages`; torch and torchvision are not reinstalled.
- `index`: `TORCH_INDEX=URL` (PyTorch's ROCm or CUDA wheel index): torch and torchvision from there.
- `default`: anything else, e.g. a plain CPU machine: `torch==2.14.1 torchvision==0.29.1` from the
  package index, exactly what `make setup` always did.

`suggest_fix()` turns "the machine has a GPU that this venv's torch cannot see" into the make command
that fixes it; `inceptionlab doctor` prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PINS = ("torch==2.14.1", "torchvision==0.29.1")
DEFAULT_EXTRAS = "test,demo"
FROM_SYSTEM_CHOICES = ("auto", "1", "0")
# pyproject.toml's floors (torch>=2.4, torchvision>=0.19): an older system torch would make pip
# install a second torch into the venv, which is what reusing it is meant to avoid.
MIN_TORCH = (2, 4)
MIN_TORCHVISION = (0, 19)
# Importing torch takes 2-10 s; a minute means the interpreter hangs (e.g. a stuck GPU driver).
PROBE_TIMEOUT_S = 120
ROCM_VERSION_FILE = "/opt/rocm/.info/version"
# The CUDA build the default torch 2.14.1 pins resolve to on Linux x86_64 (2.14.1+cu130).
DEFAULT_CUDA_WHEEL = "cu130"
BUILD_LABELS = {"rocm": "ROCm build", "cuda": "CUDA build", "cpu": "CPU-only build"}
INDEX_HINT = "PyTorch's wheel index; pytorch.org/get-started/locally prints the full URL"

PROBE_SCRIPT = """
import json
info = {}
try:
    import torch
except Exception as exc:
    info["error"] = f"{type(exc).__name__}: {exc}"
else:
    info["torch"] = torch.__version__
    info["hip"] = getattr(torch.version, "hip", None)
    info["cuda"] = torch.version.cuda
    info["file"] = torch.__file__
    try:
        info["gpu_count"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        info["gpu_count"] = 0
    try:
        import torchvision
        info["torchvision"] = torchvision.__version__
    except Exception:
        info["torchvision"] = None
print("INCEPTIONLAB_PROBE " + json.dumps(info))
"""


class PlanError(Exception):
    """The requested set-up cannot work here; the message names the fix."""


@dataclass(frozen=True)
class TorchInfo:
    """The torch an interpreter imports: what it was built for and whether it sees a GPU."""

    version: str
    hip: str | None = None
    cuda: str | None = None
    gpu_count: int = 0
    torchvision: str | None = None
    file: str | None = None

    @property
    def kind(self) -> str:
        return build_kind(self.hip, self.cuda)

    def describe(self) -> str:
        seen = f"{self.gpu_count} GPU(s) visible" if self.gpu_count else "no GPU visible"
        return f"torch {self.version} ({describe_build(self.hip, self.cuda)}, {seen})"


def build_kind(hip: str | None, cuda: str | None) -> str:
    """rocm, cuda or cpu: what a torch was compiled for (its torch.version.hip / .cuda)."""
    # ROCm builds also set torch.version.cuda on some releases, so HIP wins.
    if hip:
        return "rocm"
    return "cuda" if cuda else "cpu"


def describe_build(hip: str | None, cuda: str | None) -> str:
    return {"rocm": f"ROCm build, HIP {hip}", "cuda": f"CUDA {cuda} build", "cpu": BUILD_LABELS["cpu"]}[
        build_kind(hip, cuda)]


def probe_torch(python: str, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> TorchInfo | None:
    """The torch that `python` imports, or None when it has none (or the probe fails)."""
    try:
        done = run([python, "-c", PROBE_SCRIPT], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("INCEPTIONLAB_PROBE ")), None)
    if line is None:
        return None
    info = json.loads(line.split(" ", 1)[1])
    if "torch" not in info:
        return None
    return TorchInfo(
        version=info["torch"],
        hip=info.get("hip"),
        cuda=info.get("cuda"),
        gpu_count=int(info.get("gpu_count") or 0),
        torchvision=info.get("torchvision"),
        file=info.get("file"),
    )


def base_interpreter() -> str:
    """The system interpreter, even when this runs inside a venv (an activated .venv's python3)."""
    if sys.prefix != sys.base_prefix:
        base = getattr(sys, "_base_executable", None)
        if base and os.path.exists(base):
            return base
    return sys.executable


def rocm_version(path: str = ROCM_VERSION_FILE) -> str | None:
    """ROCm's major.minor from /opt/rocm/.info/version ("6.4.1-120" -> "6.4"), or None."""
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    parts = text.split("-")[0].split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 and all(p.isdigit() for p in parts[:2]) else None


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class SetupOptions:
    venv: str = ".venv"
    python: str = sys.executable
    torch_index: str = ""  # TORCH_INDEX: a wheel index URL (ROCm / CUDA builds)
    torch_from_system: str = "auto"  # TORCH_FROM_SYSTEM: auto | 1 (always reuse) | 0 (never)
    pins: tuple[str, ...] = DEFAULT_PINS  # TORCH_PINS
    extras: str = DEFAULT_EXTRAS


@dataclass(frozen=True)
class VenvState:
    """An existing venv: does it see the system's site-packages?"""

    system_site_packages: bool

    @classmethod
    def read(cls, venv: str) -> VenvState | None:
        python = Path(venv) / "bin" / "python"
        if not os.access(python, os.X_OK):
            return None
        try:
            cfg = (Path(venv) / "pyvenv.cfg").read_text()
        except OSError:
            return cls(system_site_packages=False)
        for line in cfg.splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "include-system-site-packages":
                return cls(system_site_packages=value.strip().lower() == "true")
        return cls(system_site_packages=False)


@dataclass(frozen=True)
class SetupPlan:
    mode: str  # system | index | default
    reason: str
    system_site_packages: bool
    commands: tuple[tuple[str, ...], ...]

    def shell_lines(self) -> list[str]:
        return [shlex.join(cmd) for cmd in self.commands]

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "reason": self.reason,
            "system_site_packages": self.system_site_packages,
            "commands": self.shell_lines(),
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


def make_plan(opts: SetupOptions, system: TorchInfo | None, existing: VenvState | None) -> SetupPlan:
    """The commands that set up `opts.venv`; pure, so every branch is unit-tested."""
    mode, reason = choose_source(opts, system)
    want_system = mode == "system"
    if want_system:
        _check_reusable(system, opts.python)
    _check_existing_venv(opts, existing, want_system)
    py = str(Path(opts.venv) / "bin" / "python")
    pip = (py, "-m", "pip", "install", "-q")
    package = f".[{opts.extras}]" if opts.extras else "."
    commands: list[tuple[str, ...]] = []
    if existing is None:
        flags = ("--system-site-packages",) if want_system else ()
        commands.append((opts.python, "-m", "venv", *flags, opts.venv))
    commands.append((*pip, "--upgrade", "pip"))
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
    return SetupPlan(mode, reason, want_system, tuple(commands))


def _same_torch_check(system: TorchInfo) -> str:
    # Double quotes only, so the shell form that `make setup-plan` prints stays readable.
    return (
        f'import sys, torch; v = torch.__version__; sys.exit(0 if v == "{system.version}" else '
        f'f"pip replaced the system torch {system.version} by {{v}}: run `make clean setup TORCH_FROM_SYSTEM=0` '
        f'or report the dependency that asked for it")'
    )


# --------------------------------------------------------------------------- doctor's fix


def suggest_fix(
    venv_torch: TorchInfo,
    system_torch: TorchInfo | None,
    amd: bool,
    nvidia: bool,
    rocm: str | None = None,
) -> str | None:
    """The set-up command that gives this venv a torch able to use the machine's GPU, if the
    torch build is the problem; None when the build is right (then drivers, groups etc. are)."""
    if not (amd or nvidia):
        return None
    wanted = "rocm" if amd and not nvidia else "cuda" if nvidia and not amd else None
    if (
        system_torch is not None
        and system_torch.kind != "cpu"
        and system_torch.kind != venv_torch.kind
        and (wanted is None or system_torch.kind == wanted)
    ):
        return (
            f"`make clean setup TORCH_FROM_SYSTEM=1`: the system Python's {system_torch.describe()} "
            f"is hidden by this venv's own torch {venv_torch.version} ({BUILD_LABELS[venv_torch.kind]})"
        )
    if wanted == "rocm" and venv_torch.kind != "rocm":
        wheel = f"rocm{rocm}" if rocm else "rocmX.Y"
        return (
            f"`make clean setup TORCH_INDEX=.../whl/{wheel}` ({INDEX_HINT}; "
            f"{'ROCm ' + rocm + ' is installed here' if rocm else 'match the ROCm version in /opt/rocm/.info/version'})"
        )
    if wanted == "cuda" and venv_torch.kind != "cuda":
        return (
            f"`make clean setup TORCH_INDEX=.../whl/{DEFAULT_CUDA_WHEEL}` ({INDEX_HINT}; "
            "pick the cuXYZ that nvidia-smi's CUDA version supports)"
        )
    return None


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
    )


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
        plan = make_plan(opts, system, VenvState.read(opts.venv))
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
        return 0
    print(f"setup: {plan.mode}: {plan.reason}", flush=True)
    if args.run:
        return execute(plan)
    print("\n".join(plan.shell_lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
