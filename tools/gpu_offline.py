"""The GPU report on a machine with no network: its missing packages carried as wheels, one command there.

Two steps (docs/testing.md, "The GPU report on a machine without network"):

- here, with the package index: `make gpu-wheels` (`python3 tools/gpu_offline.py wheels`) downloads,
  for the GPU image's Python (tools/gpu_image.toml: CPython 3.12, manylinux x86_64), the wheels of
  everything the report needs that the image lacks into .gpu-wheels/, packs a subset of tiny-imagenet
  into .gpu-data/, and checks that both fit the device tool's 64 MiB beside the working tree;
- there, with no network: `python3 tools/gpu_offline.py report --out $OUT` makes a venv that sees the
  image's own packages (torch 2.11, torchvision 0.26, onnxruntime, ...), installs the project into it
  from .gpu-wheels alone (no index, a dead proxy: nothing can be fetched), and runs
  benchmarks/gpu_report.py within the time left (`--time-limit`, the whole command's).

Which packages the image has is written once, in tools/gpu_image.toml; what the report needs is
REPORT_EXTRAS and REPORT_TOOLS below; the rest follows from pyproject.toml and each wheel's metadata.

Standard library only (and `packaging`, from pip where it is not installed): it runs with the image's
python3, before the project is installed.
"""

from __future__ import annotations

import argparse
import email.parser
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as distribution_version
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a bare python3 with pip has it vendored
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
IMAGE_TABLE = REPO / "tools" / "gpu_image.toml"
WHEELS = REPO / ".gpu-wheels"
DATA = REPO / ".gpu-data"
MANIFEST = "manifest.json"
MIB = 1024 * 1024

# The extras whose packages the report's parts import, and for what. Parts whose extra did not install
# skip, saying which module they miss (benchmarks/gpu_report.py, Part.needs).
REPORT_EXTRAS = {
    "serve": "the serve sweep: inceptionlab serve (FastAPI, uvicorn, multipart, gRPC health)",
    "loadtest": "the serve sweep's load generator (aiohttp, gRPC)",
    "onnx-export": "bench's ONNX Runtime rows (the export needs onnx, onnxscript)",
}
# The GPU-marked tests' runner: pyproject's addopts use pytest-timeout's --timeout.
REPORT_TOOLS = ("pytest>=8", "pytest-timeout>=2.3")
# Not carried, and why: each is bigger than the carry limit allows beside the tree, or useless there.
LEFT_OUT = {
    "openvino": "OpenVINO runs on CPUs and Intel GPUs, not on NVIDIA's; its wheel (~45 MB) and NNCF would "
                "leave no room for the tree and the data in 64 MiB. The report has no OpenVINO row; "
                "GPU-marked tests that need it skip",
    "onnxruntime-gpu": "its CUDA 13 build is ~250 MB: the image's CPU-only onnxruntime stays, and the report's "
                       "ONNX Runtime GPU rows skip, saying the provider is missing",
    "tritonclient": "only the gRPC server tests use it, and none of them is GPU-marked",
}
# Versions carried beside the newest because they pair with older grpcio/protobuf than the newest
# needs (1.81 wants grpcio>=1.81 and protobuf>=6.31): the image's own versions of those were not read,
# and pip's resolver takes the newest one here that the image's grpcio and protobuf allow. ~20 kB each.
ALSO_CARRY = {"grpcio-health-checking": ("1.66.2", "1.70.0", "1.74.0", "1.78.0")}
# Released in lockstep with grpcio (its X.Y.Z needs grpcio >= X.Y.Z and a protobuf of its day): where the
# table knows the image's grpcio, that very release is carried instead. The H200 image of 2026-12-04 had
# grpcio 1.84.0 with protobuf 7.36.2, which none of the five above accepts (1.85.1: grpcio >= 1.85.1;
# the others: protobuf < 7).
PAIRED_WITH = {"grpcio-health-checking": "grpcio"}
# A fallback for a package the image has in a version not read is carried only if pure Python and at
# most this big: typing-extensions (pydantic 2.14 needs >= 4.16) is 44 kB; tensorboard (5.3 MB) is not.
FALLBACK_MAX_BYTES = 1 * 1024 * 1024
# tiny-imagenet carried for the training part: 12 training and 5 validation images per class, ~12 MB
# (the training part reads at most 2,048 training images and one batch of validation).
TRAIN_PER_CLASS = 12
VAL_PER_CLASS = 5
# The whole command's time on the device (its timeout_s less ~30 s to spare), install included.
TIME_LIMIT_S = 540
# A dead proxy: a pip step that tried the network would fail at once instead of waiting.
DEAD_PROXY = "http://127.0.0.1:9"


class OfflineError(Exception):
    """The wheelhouse cannot be built or used as asked; the message names the fix."""


# --------------------------------------------------------------------------- the image and the requirements


@dataclass(frozen=True)
class Image:
    """The GPU image's Python and packages (tools/gpu_image.toml)."""

    python: str
    implementation: str
    abi: str
    platforms: tuple[str, ...]
    packages: dict[str, str]  # canonical name -> version ("" where not read)
    limit_mib: int

    @classmethod
    def read(cls, path: Path = IMAGE_TABLE) -> Image:
        table = tomllib.loads(path.read_text())
        python = table["python"]
        return cls(python["version"], python["implementation"], python["abi"], tuple(python["platforms"]),
                   {canonicalize_name(name): version for name, version in table["packages"].items()},
                   int(table["carry"]["limit_mib"]))

    def markers(self, extra: str = "") -> dict[str, str]:
        """The environment markers of that Python on Linux x86_64."""
        return {"python_version": self.python, "python_full_version": f"{self.python}.0", "os_name": "posix",
                "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
                "platform_release": "", "platform_version": "", "implementation_name": "cpython",
                "implementation_version": f"{self.python}.0", "platform_python_implementation": "CPython",
                "extra": extra}


def pyproject(path: Path = REPO / "pyproject.toml") -> dict:
    return tomllib.loads(path.read_text())


def extra_requirements(project: dict, extras: Iterable[str]) -> list[str]:
    """The requirement strings of `extras`, the project's own extras (`inceptionlab[onnx-export]`) expanded."""
    name = canonicalize_name(project["project"]["name"])
    table = project["project"]["optional-dependencies"]
    seen: set[str] = set()
    found: list[str] = []
    pending = deque(extras)
    while pending:
        extra = pending.popleft()
        if extra in seen:
            continue
        if extra not in table:
            raise OfflineError(f"pyproject.toml has no extra {extra!r} (it has {', '.join(sorted(table))})")
        seen.add(extra)
        for text in table[extra]:
            requirement = Requirement(text)
            if canonicalize_name(requirement.name) == name:
                pending.extend(sorted(requirement.extras))
            elif text not in found:
                found.append(text)
    return found


def report_requirements(project: dict) -> list[tuple[str, str]]:
    """(requirement, why) for everything the report needs installed: the package's own dependencies,
    REPORT_EXTRAS' and REPORT_TOOLS."""
    wanted = [(text, "inceptionlab") for text in project["project"]["dependencies"]]
    for extra, why in REPORT_EXTRAS.items():
        wanted += [(text, f"extra {extra}: {why}") for text in extra_requirements(project, [extra])]
    wanted += [(text, "the GPU-marked tests' runner") for text in REPORT_TOOLS]
    return wanted


# --------------------------------------------------------------------------- the wheelhouse


@dataclass
class Wheel:
    file: str
    name: str  # canonical
    version: str
    requires: list[str]
    bytes: int
    path: str = ""
    needed_by: list[str] = field(default_factory=list)
    fallback: bool = False  # the image has it, in a version not read: carried in case that one is too old

    @property
    def pure(self) -> bool:
        return self.file.endswith("-none-any.whl")

    @classmethod
    def read(cls, path: Path) -> Wheel:
        with zipfile.ZipFile(path) as archive:
            metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
            message = email.parser.Parser().parsestr(archive.read(metadata).decode())
        return cls(path.name, canonicalize_name(message["Name"]), message["Version"],
                   message.get_all("Requires-Dist") or [], path.stat().st_size, str(path))


@dataclass
class Wheelhouse:
    wheels: dict[str, list[Wheel]] = field(default_factory=dict)  # name -> the versions carried, chosen first
    from_image: dict[str, list[str]] = field(default_factory=dict)  # name -> requirements the image meets
    not_pure: set[str] = field(default_factory=set)  # unknown image versions without a fallback (compiled, big)
    conflicts: list[str] = field(default_factory=list)

    def all_wheels(self) -> list[Wheel]:
        return [wheel for versions in self.wheels.values() for wheel in versions]

    @property
    def bytes(self) -> int:
        return sum(wheel.bytes for wheel in self.all_wheels())


Fetch = Callable[[str], Path]  # a requirement string -> the wheel file it brought


def collect(wanted: Iterable[tuple[str, str]], image: Image, fetch: Fetch,
            also: dict[str, tuple[str, ...]] | None = None, force: Iterable[str] = ()) -> Wheelhouse:
    """Walk the requirements and their wheels' own: what the image has is noted, the rest fetched once.

    Where the table has no version for a package the image has, a requirement with a lower bound
    cannot be judged here: a small pure-Python wheel of it is carried as a fallback (pip there keeps the
    image's when it satisfies, else installs this one into the venv). `force`: names carried even so
    (the build backend, which pip installs into an isolated build environment from the wheels alone).
    A requirement that the image's known version, or the wheel already chosen, does not meet is a
    conflict (the caller refuses to go on): pip there would fail the same way.
    """
    house = Wheelhouse()
    forced = {canonicalize_name(name) for name in force}
    queue = deque(wanted)
    while queue:
        text, why = queue.popleft()
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        in_image = name in image.packages and name not in forced
        if in_image:
            house.from_image.setdefault(name, [])
            if text not in house.from_image[name]:
                house.from_image[name].append(text)
            known = image.packages[name]
            if known and not requirement.specifier.contains(known, prereleases=True):
                house.conflicts.append(f"{text} (needed by {why}): the image has {name} {known}")
        if name in house.wheels or name in house.not_pure:
            chosen = house.wheels.get(name, [None])[0]
            if chosen and not requirement.specifier.contains(chosen.version, prereleases=True):
                house.conflicts.append(f"{text} (needed by {why}): {chosen.file} was chosen first")
            elif chosen and why not in chosen.needed_by:
                chosen.needed_by.append(why)
            continue
        if in_image and (image.packages[name] or not requirement.specifier):
            continue  # the image's version meets it, or anything does
        paired = image.packages.get(PAIRED_WITH.get(name, ""), "")
        if paired and requirement.specifier.contains(paired, prereleases=True):
            text, also_here = f"{name}=={paired}", ()
        else:
            also_here = (also or {}).get(name, ())
        first = Wheel.read(fetch(text))
        if in_image and (not first.pure or first.bytes > FALLBACK_MAX_BYTES):
            Path(first.path).unlink()  # a compiled fallback could clash with the image's own builds
            house.not_pure.add(name)
            continue
        first.fallback = in_image
        older = [Wheel.read(fetch(f"{name}=={version}")) for version in also_here]
        house.wheels[name] = [first, *older]
        first.needed_by.append(why)
        for wheel in house.wheels[name]:
            queue.extend((dep, wheel.name) for dep in wheel.requires if _applies(dep, requirement.extras, image))
    return house


def _applies(text: str, extras: Iterable[str], image: Image) -> bool:
    marker = Requirement(text).marker
    return marker is None or any(marker.evaluate(image.markers(extra)) for extra in ("", *extras))


def pip_fetch(image: Image, into: Path, python: str = sys.executable) -> Fetch:
    """Fetch one requirement's wheel for the image's Python and platforms; a project that publishes
    only a source archive is built here into a wheel, accepted only if pure Python."""
    into.mkdir(parents=True, exist_ok=True)
    target = ["--python-version", image.python, "--implementation", image.implementation, "--abi", image.abi,
              *[arg for platform in image.platforms for arg in ("--platform", platform)]]

    def fetch(text: str) -> Path:
        with tempfile.TemporaryDirectory() as tmp:
            got = subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                                  *target, "-d", tmp, text], capture_output=True, text=True)
            if got.returncode != 0:
                return _build_pure_wheel(text, python, into, got.stderr)
            (path,) = Path(tmp).iterdir()
            return Path(shutil.move(str(path), into / path.name))

    return fetch


def _build_pure_wheel(text: str, python: str, into: Path, why: str) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        built = subprocess.run([python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-binary=:all:", "-w", tmp, text],
                               capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if built.returncode != 0 or len(wheels) != 1:
            raise OfflineError(f"no wheel of {text} for the image's Python: {why.strip()[-500:]}")
        if not wheels[0].name.endswith("-none-any.whl"):
            raise OfflineError(f"{text} has no wheel for the image and builds only for this machine "
                               f"({wheels[0].name}): carry it another way")
        return Path(shutil.move(str(wheels[0]), into / wheels[0].name))


def build_requirements(project: dict) -> list[str]:
    """The build backend (setuptools>=77): always carried, since pip builds the package in an isolated
    environment that it fills from the wheelhouse alone."""
    return list(project["build-system"]["requires"])


# --------------------------------------------------------------------------- the data


def pack_tiny_imagenet(source: Path, target: Path, train_per_class: int = TRAIN_PER_CLASS,
                       val_per_class: int = VAL_PER_CLASS) -> dict[str, int]:
    """A subset of tiny-imagenet-200 in its original layout (train/<wnid>/images and boxes, flat
    val/images with its annotations): the first images of each class by name, the same every time."""
    if not (source / "wnids.txt").is_file():
        raise OfflineError(f"{source} is not tiny-imagenet-200 (no wnids.txt): give --tiny DIR, or "
                           "`inceptionlab data tiny-imagenet` first")
    dataset = target / "tiny-imagenet-200"
    if dataset.exists():
        shutil.rmtree(dataset)  # our own build output, made by this function
    (dataset / "val" / "images").mkdir(parents=True)
    for name in ("wnids.txt", "words.txt"):
        shutil.copy2(source / name, dataset / name)
    wnids = (source / "wnids.txt").read_text().split()
    train = sum(_pack_class(source / "train" / wnid, dataset / "train" / wnid, train_per_class) for wnid in wnids)
    val = _pack_val(source / "val", dataset / "val", val_per_class)
    return {"classes": len(wnids), "train_images": train, "val_images": val, "bytes": _tree_bytes(dataset)}


def _pack_class(source: Path, target: Path, count: int) -> int:
    (target / "images").mkdir(parents=True)
    images = sorted((source / "images").iterdir(), key=lambda p: p.name)[:count]
    for image in images:
        shutil.copy2(image, target / "images" / image.name)
    kept = {image.name for image in images}
    for boxes in source.glob("*_boxes.txt"):
        lines = [line for line in boxes.read_text().splitlines() if line.split("\t", 1)[0] in kept]
        (target / boxes.name).write_text("".join(f"{line}\n" for line in lines))
    return len(images)


def _pack_val(source: Path, target: Path, per_class: int) -> int:
    if (source / "val_annotations.txt").is_file():  # the original flat layout
        per: dict[str, int] = {}
        lines = []
        for line in (source / "val_annotations.txt").read_text().splitlines():
            name, wnid = line.split("\t")[:2]
            if per.get(wnid, 0) < per_class:
                per[wnid] = per.get(wnid, 0) + 1
                lines.append(line)
                shutil.copy2(source / "images" / name, target / "images" / name)
        (target / "val_annotations.txt").write_text("".join(f"{line}\n" for line in lines))
        return len(lines)
    raise OfflineError(f"{source}: no val_annotations.txt (a val folder already regrouped by class); "
                       "pack from the original layout")


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def working_tree_bytes(repo: Path = REPO) -> int:
    """What the device tool sends besides the carried paths: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, text=True, check=True).stdout
    return sum((repo / name).stat().st_size for name in listed.split("\0") if name and (repo / name).is_file())


# --------------------------------------------------------------------------- `wheels`: here


def build(wheels: Path, data: Path | None, tiny: Path | None, image: Image, fetch: Fetch | None = None,
          tree_bytes: int | None = None, say: Callable[[str], None] = print) -> dict:
    """Fill `wheels` (and `data`), write the manifest, and check the carry limit; returns the manifest."""
    project = pyproject()
    wheels.mkdir(parents=True, exist_ok=True)
    for old in [*wheels.glob("*.whl"), wheels / MANIFEST]:  # our own previous build
        old.unlink(missing_ok=True)
    fetch = fetch or pip_fetch(image, wheels)
    wanted = report_requirements(project) + [(text, "the build backend") for text in build_requirements(project)]
    house = collect(wanted, image, fetch, ALSO_CARRY, force=[Requirement(t).name for t in build_requirements(project)])
    if house.conflicts:
        raise OfflineError("the image cannot meet these requirements (correct tools/gpu_image.toml, or "
                           "pyproject.toml):\n  " + "\n  ".join(house.conflicts))
    for wheel in house.all_wheels():
        role = "fallback for the image's, " if wheel.fallback else ""
        say(f"  {wheel.file:<64} {wheel.bytes / MIB:5.2f} MiB  {role}{', '.join(wheel.needed_by) or 'older version'}")
    packed = pack_tiny_imagenet(tiny, data) if data and tiny else None
    tree = working_tree_bytes() if tree_bytes is None else tree_bytes
    total = house.bytes + (packed["bytes"] if packed else 0) + tree
    manifest = {
        "python": image.python, "abi": image.abi, "platforms": list(image.platforms),
        "built": time.strftime("%Y-%m-%dT%H:%M:%S"), "report_extras": REPORT_EXTRAS,
        "report_tools": list(REPORT_TOOLS), "left_out": LEFT_OUT,
        "wheels": [{k: v for k, v in asdict(wheel).items() if k != "path"} for wheel in house.all_wheels()],
        "from_image": house.from_image, "no_fallback": sorted(house.not_pure),
        "data": packed, "bytes": {"wheels": house.bytes, "data": packed["bytes"] if packed else 0, "tree": tree,
                                  "total": total, "limit": image.limit_mib * MIB},
    }
    (wheels / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    say(f"wheels: {len(house.all_wheels())} files, {house.bytes / MIB:.1f} MiB in {wheels}; "
        + (f"data: {packed['train_images']} + {packed['val_images']} images, {packed['bytes'] / MIB:.1f} MiB in "
           f"{data}; " if packed else "no data; ")
        + f"tree {tree / MIB:.1f} MiB: {total / MIB:.1f} of {image.limit_mib} MiB carried")
    if total > image.limit_mib * MIB:
        raise OfflineError(f"{total / MIB:.1f} MiB would travel, over the device tool's {image.limit_mib} MiB: "
                           "carry less data (--train-per-class) or fewer extras")
    return manifest


# --------------------------------------------------------------------------- `report`: on the GPU machine


@dataclass
class Step:
    name: str
    command: list[str]  # empty: nothing to install
    required: bool = False  # the report cannot run without it
    met: list[str] = field(default_factory=list)  # requirements the image already meets
    ok: bool = False
    seconds: float = 0.0
    tail: str = ""


def offline_env(wheels: Path) -> dict[str, str]:
    """pip with the wheelhouse as its only source: no index, no cache, and a proxy that answers nothing."""
    return {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels), "PIP_NO_CACHE_DIR": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_PROXY": DEAD_PROXY, "HTTP_PROXY": DEAD_PROXY,
            "HTTPS_PROXY": DEAD_PROXY, "PIP_NO_INPUT": "1"}


def make_venv(venv: Path, python: str = sys.executable) -> Path:
    """A venv that sees `python`'s packages and uses its pip. `--system-site-packages` alone shows the
    base interpreter's; the image's python3 is itself a venv (/opt/torch/.venv), so its site-packages
    are added by a .pth file. Without pip of its own: the visible pip installs into the new venv."""
    if venv.exists():
        shutil.rmtree(venv)  # ours: made by an earlier run of this command
    subprocess.run([python, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    own = next((venv / "lib").glob("python3*/site-packages"))
    parents = subprocess.run([python, "-c", "import site, sys; print('\\n'.join(site.getsitepackages()))"],
                             capture_output=True, text=True, check=True).stdout.split()
    (own / "_inceptionlab_parent_env.pth").write_text("".join(f"{path}\n" for path in parents))
    return venv / "bin" / "python"


def install_steps(python: Path, project: dict, version_of: Callable[[str], str | None] | None = None) -> list[Step]:
    """The package without its dependencies, then its dependencies, each extra the report uses and the
    test runner, each group on its own so a missing extra costs only the parts that need it.

    Only the requirements the image does not meet are given to pip: pip checks again the requirements
    of every installed package it is handed, so asking for matplotlib would fail on any package of the
    image whose own requirement the image lacks (seen on a stand-in: python-dateutil 4.0 without tzdata),
    although the report needs none of that.
    """
    version_of = version_of or _installed_version
    pip = [str(python), "-m", "pip", "install", "-q", "--no-index"]
    steps = [Step("inceptionlab", [*pip, "--no-deps", "-e", str(REPO)], required=True)]
    groups = {"dependencies": (list(project["project"]["dependencies"]), True),
              **{f"extra {extra}": (extra_requirements(project, [extra]), False) for extra in REPORT_EXTRAS},
              "test runner": (list(REPORT_TOOLS), False)}
    for name, (wanted, required) in groups.items():
        met = [text for text in wanted if _met(Requirement(text), version_of)]
        unmet = [text for text in wanted if text not in met]
        steps.append(Step(name, [*pip, *unmet] if unmet else [], required, met))
    return steps


def _met(requirement: Requirement, version_of: Callable[[str], str | None]) -> bool:
    if requirement.marker is not None and not requirement.marker.evaluate():
        return True
    version = version_of(requirement.name)
    return version is not None and requirement.specifier.contains(version, prereleases=True)


def _installed_version(name: str) -> str | None:
    """The version this interpreter (the image's, whose packages the venv sees) has installed, if any."""
    try:
        return distribution_version(name)
    except PackageNotFoundError:
        return None


def run_step(step: Step, env: dict[str, str], log: Path, timeout: float) -> Step:
    if not step.command:
        step.ok, step.tail = True, "met by the image: " + ", ".join(step.met)
        return step
    started = time.monotonic()
    try:
        done = subprocess.run(step.command, env=env, capture_output=True, text=True, timeout=max(timeout, 1))
        step.ok, output = done.returncode == 0, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        step.ok, output = False, f"{exc.stdout or ''}{exc.stderr or ''}\nstopped after {timeout:.0f} s"
    step.seconds = round(time.monotonic() - started, 1)
    step.tail = output.strip()[-1500:]
    with open(log, "a") as file:
        file.write(f"$ {' '.join(step.command)}\n{output}\n")
    return step


def image_packages(python: Path) -> dict[str, str]:
    """Every distribution the venv sees, the image's included: name -> version."""
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True)
    try:
        return {row["name"]: row["version"] for row in json.loads(listed.stdout)}
    except (json.JSONDecodeError, KeyError):
        return {}


def report(args: argparse.Namespace) -> int:
    started = time.monotonic()
    image = Image.read()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-report-work-"))
    if not (args.wheels / MANIFEST).is_file():
        raise OfflineError(f"no wheelhouse at {args.wheels}: run `make gpu-wheels` where pip reaches the index "
                           "and carry .gpu-wheels (docs/testing.md)")
    if f"{sys.version_info[0]}.{sys.version_info[1]}" != image.python:
        print(f"warning: this is Python {sys.version.split()[0]}; the wheels are for {image.python}", flush=True)
    python = make_venv(args.venv)
    env = offline_env(args.wheels.resolve())
    log = work / "install.log"
    steps = []
    for step in install_steps(python, pyproject()):
        steps.append(run_step(step, env, log, args.time_limit - (time.monotonic() - started)))
        done = "met by the image" if not step.command else f"{'ok' if step.ok else 'FAILED'} in {step.seconds:.0f} s"
        print(f"install {step.name}: {done}" + ("" if step.ok else f"\n{step.tail}"), flush=True)
        if step.required and not step.ok:
            break
    record = {"steps": [asdict(step) for step in steps], "seconds": round(time.monotonic() - started, 1),
              "venv": str(args.venv), "wheels": json.loads((args.wheels / MANIFEST).read_text())["wheels"],
              "image_packages": image_packages(python), "log": str(log)}
    (work / "install.json").write_text(json.dumps(record, indent=2))
    if not all(step.ok for step in steps if step.required):
        (out / "gpu_report-install-failed.json").write_text(json.dumps(record, indent=2))
        print(f"the package did not install from {args.wheels}: see {out / 'gpu_report-install-failed.json'}",
              file=sys.stderr)
        return 1
    left = args.time_limit - (time.monotonic() - started)
    dataset = args.data / "tiny-imagenet-200"
    command = [str(python), str(REPO / "benchmarks" / "gpu_report.py"), "--out", str(out), "--work", str(work),
               "--install-record", str(work / "install.json"), "--budget-s", f"{left - 15:.0f}",
               *(["--data", str(dataset)] if dataset.is_dir() else []),
               *(["--dry-run"] if args.dry_run else [])]
    print("$ " + " ".join(command), flush=True)
    return subprocess.run(command, env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=REPO).returncode


# --------------------------------------------------------------------------- a stand-in for the image, here


# Packages the image has that the project imports where present (ONNX Runtime's rows, the demo, the
# event loop), beside those the report's requirements take from the image.
STANDIN_ALSO = ("onnxruntime", "scikit-learn", "uvloop")


def standin_requirements(manifest: dict, image: Image) -> list[str]:
    """What to install (from the index) into a venv with the image's torch and torchvision so that it
    stands in for the image on a CPU machine: every package the report takes from the image, at the
    table's version where it has one."""
    return [f"{name}=={image.packages[name]}" if image.packages[name] else name
            for name in sorted({*manifest["from_image"], *STANDIN_ALSO}) if name not in ("torch", "torchvision")]


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    wheels = commands.add_parser("wheels", help="here: download the wheels the GPU image lacks, pack the data")
    wheels.add_argument("--wheels", type=Path, default=WHEELS)
    wheels.add_argument("--data", type=Path, default=DATA)
    wheels.add_argument("--tiny", type=Path, default=REPO.parent / "shared" / "data" / "tiny-imagenet-200",
                        help="tiny-imagenet-200 in its original layout (default: ../shared/data's)")
    wheels.add_argument("--no-data", action="store_true", help="wheels only")
    run = commands.add_parser("report", help="on the GPU machine: venv, offline install, the report")
    run.add_argument("--wheels", type=Path, default=WHEELS)
    run.add_argument("--data", type=Path, default=DATA)
    run.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "inceptionlab-gpu-venv")
    run.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or REPO / "benchmarks" / "results"),
                     help="where the report goes (default: $OUT, else benchmarks/results)")
    run.add_argument("--time-limit", type=float, default=TIME_LIMIT_S,
                     help=f"seconds for all of it, install included (default {TIME_LIMIT_S})")
    run.add_argument("--dry-run", action="store_true", help="install, then the report's dry run")
    standin = commands.add_parser("standin", help="here: print the pip command that makes a venv with torch "
                                                  "2.11 stand in for the image (the packages it takes from there)")
    standin.add_argument("--wheels", type=Path, default=WHEELS)
    args = parser.parse_args(argv)
    try:
        if args.command == "standin":
            manifest = json.loads((args.wheels / MANIFEST).read_text())
            print(" ".join(["pip", "install", *standin_requirements(manifest, Image.read())]))
            return 0
        if args.command == "wheels":
            build(args.wheels, None if args.no_data else args.data, None if args.no_data else args.tiny, Image.read())
            return 0
        return report(args)
    except OfflineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
