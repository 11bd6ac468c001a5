"""tools/gpu_offline.py: the wheelhouse for the GPU machine (what it carries and why), the data subset,
the venv that sees the image's packages, and the install that never reaches the network."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers.datasets import write_tiny_imagenet
from inceptionlab.data.datasets.tiny_imagenet import prepare_tiny_imagenet

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))  # a make-time tool, outside the package
import gpu_offline  # noqa: E402
from gpu_offline import Image, OfflineError, Requirement, collect  # noqa: E402

IMAGE = Image("3.12", "cp", "cp312", ("manylinux2014_x86_64",),
              {"torch": "2.11.0", "numpy": "2.5.2", "typing-extensions": "", "tensorboard": "", "click": ""},
              limit_mib=64)


def wheel(folder: Path, name: str, version: str, requires: list[str] = (), tag: str = "py3-none-any",
          padding: int = 0) -> Path:
    """A wheel file with just its METADATA (and `padding` bytes of payload)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name.replace('-', '_')}-{version}-{tag}.whl"
    metadata = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                        *[f"Requires-Dist: {r}\n" for r in requires]])
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    files = {f"{info}/METADATA": metadata, f"{info}/WHEEL": f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tag}\n"}
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
        archive.writestr(f"{info}/RECORD", "".join(f"{member},,\n" for member in [*files, f"{info}/RECORD"]))
        if padding:
            archive.writestr("payload.bin", bytes(padding))  # stored: the file really is this big
    return path


class Index:
    """A fake package index: requirement -> the newest wheel of it that it holds; records what was asked."""

    def __init__(self, folder: Path, wheels: dict[str, list[tuple[str, list[str], dict]]]):
        self.folder, self.wheels, self.asked = folder, wheels, []

    def __call__(self, text: str) -> Path:
        self.asked.append(text)
        requirement = Requirement(text)
        name = gpu_offline.canonicalize_name(requirement.name)
        versions = [v for v in self.wheels[name] if requirement.specifier.contains(v[0])]
        version, requires, options = max(versions, key=lambda v: tuple(map(int, v[0].split("."))))
        return wheel(self.folder, name, version, requires, **options)


def test_what_the_image_has_is_not_fetched_and_the_rest_is_followed_through_its_own_requirements(tmp_path):
    index = Index(tmp_path, {
        "omegaconf": [("2.4.0", ["PyYAML>=5.1", 'sphinx; extra == "dev"', 'antlr4; python_version < "3.8"'], {})],
        "pyyaml": [("6.0.3", [], {"tag": "cp312-cp312-manylinux2014_x86_64"})],
        "fastapi": [("0.165.0", ["starlette>=1.6", "typing-extensions>=4.8"], {})],
        "starlette": [("1.10.0", ['httpx<0.29; extra == "full"'], {})],
        "typing-extensions": [("4.16.0", [], {})],
    })

    house = collect([("omegaconf>=2.3", "inceptionlab"), ("torch>=2.4", "inceptionlab"),
                     ("numpy>=1.26", "inceptionlab"), ("fastapi>=0.115", "extra serve")], IMAGE, index)

    assert not house.conflicts
    assert sorted(house.wheels) == ["fastapi", "omegaconf", "pyyaml", "starlette", "typing-extensions"]
    assert "torch>=2.4" not in index.asked and not any(t.startswith(("sphinx", "antlr4", "httpx")) for t in index.asked)
    assert house.from_image["torch"] == ["torch>=2.4"] and house.from_image["numpy"] == ["numpy>=1.26"]
    assert house.wheels["pyyaml"][0].needed_by == ["omegaconf"]
    # typing-extensions: the image has it in a version not read, and fastapi needs >= 4.8: carried as a fallback
    fallback = house.wheels["typing-extensions"][0]
    assert fallback.fallback and "typing-extensions" in house.from_image


def test_a_fallback_is_carried_only_small_and_pure_python(tmp_path):
    index = Index(tmp_path, {
        "tensorboard": [("2.21.0", [], {"padding": gpu_offline.FALLBACK_MAX_BYTES + 1})],
        "click": [("8.5.1", [], {"tag": "cp312-cp312-manylinux2014_x86_64"})],
        "typing-extensions": [("4.16.0", [], {})],
    })

    house = collect([("tensorboard>=2.16", "inceptionlab"), ("click>=7", "uvicorn"), ("typing-extensions", "x")],
                    IMAGE, index)

    assert house.wheels == {} and house.not_pure == {"tensorboard", "click"}
    assert not list(tmp_path.glob("*.whl"))  # what is not carried is not left in the wheelhouse
    assert "typing-extensions" not in index.asked  # no lower bound: whatever the image has will do


def test_requirements_the_image_or_the_chosen_wheel_cannot_meet_are_conflicts(tmp_path):
    index = Index(tmp_path, {"pydantic": [("2.14.4", ["pydantic-core==2.50.5"], {})],
                             "pydantic-core": [("2.50.5", [], {})], "later": [("1.0", ["pydantic-core>=2.60"], {})]})

    house = collect([("torch>=2.12", "inceptionlab"), ("pydantic>=2.9", "fastapi"), ("later", "x")], IMAGE, index)

    assert house.conflicts == ["torch>=2.12 (needed by inceptionlab): the image has torch 2.11.0",
                               "pydantic-core>=2.60 (needed by later): pydantic_core-2.50.5-py3-none-any.whl "
                               "was chosen first"]


def test_forced_packages_and_older_versions_are_carried_too(tmp_path):
    index = Index(tmp_path, {"setuptools": [("84.2.1", [], {})],
                             "grpcio-health-checking": [("1.85.1", ["grpcio>=1.85.1"], {}),
                                                        ("1.70.0", ["grpcio>=1.70.0"], {})],
                             "grpcio": [("1.85.3", [], {"tag": "cp312-cp312-manylinux2014_x86_64"})]})
    image = Image(**{**IMAGE.__dict__, "packages": {**IMAGE.packages, "setuptools": "", "grpcio": ""}})

    house = collect([("setuptools>=77", "the build backend"), ("grpcio-health-checking>=1.66", "extra serve")], image,
                    index, also={"grpcio-health-checking": ("1.70.0",)}, force=["setuptools"])

    assert [w.version for w in house.wheels["setuptools"]] == ["84.2.1"]
    assert [w.version for w in house.wheels["grpcio-health-checking"]] == ["1.85.1", "1.70.0"]
    assert house.from_image["grpcio"] == ["grpcio>=1.85.1", "grpcio>=1.70.0"]
    assert "grpcio" not in house.wheels and house.not_pure == {"grpcio"}  # compiled: the image's own build stays


def test_the_table_meets_every_requirement_of_the_report_that_it_knows_a_version_for():
    """Raising a floor past the image's version (torch>=2.12, onnx>=1.24) fails here, not on the GPU machine."""
    image = Image.read()
    wanted = gpu_offline.report_requirements(gpu_offline.pyproject())
    known = [(Requirement(text), why) for text, why in wanted
             if image.packages.get(gpu_offline.canonicalize_name(Requirement(text).name))]

    assert {req.name for req, _ in known} >= {"torch", "torchvision", "numpy", "onnx", "onnxscript", "tokenizers"}
    unmet = [f"{req} ({why})" for req, why in known
             if not req.specifier.contains(image.packages[gpu_offline.canonicalize_name(req.name)])]
    assert unmet == []
    assert image.python == "3.12" and image.packages["torch"] == "2.11.0" and image.packages["torchvision"] == "0.26.0"


def test_extras_expand_the_packages_own_extras_and_an_unknown_extra_is_refused():
    project = gpu_offline.pyproject()

    assert "onnxscript>=0.7" in gpu_offline.extra_requirements(project, ["onnx"])  # onnx -> inceptionlab[onnx-export]
    assert not any(t.startswith("inceptionlab") for t in gpu_offline.extra_requirements(project, ["test"]))
    with pytest.raises(OfflineError, match="no extra 'gpu-magic'"):
        gpu_offline.extra_requirements(project, ["gpu-magic"])


def test_the_packed_tiny_imagenet_subset_prepares_like_the_original(tmp_path):
    source = write_tiny_imagenet(tmp_path / "src", train_per_class=5, val_per_class=4)

    counts = gpu_offline.pack_tiny_imagenet(source, tmp_path / "packed", train_per_class=3, val_per_class=2)
    report = prepare_tiny_imagenet(tmp_path / "packed", progress=False)

    classes = len((source / "wnids.txt").read_text().split())
    assert (counts["classes"], counts["train_images"], counts["val_images"]) == (classes, 3 * classes, 2 * classes)
    assert (report.classes, report.train.images, report.val.images) == (classes, 3 * classes, 2 * classes)
    assert (report.train.per_class_min, report.val.per_class_max) == (3, 2)
    boxes = next((tmp_path / "packed" / "tiny-imagenet-200" / "train").glob("*/*_boxes.txt")).read_text()
    assert len(boxes.splitlines()) == 3  # only the kept images' boxes


def test_building_fails_over_the_carry_limit_and_writes_the_manifest(tmp_path, monkeypatch):
    index = Index(tmp_path / "cache", {"omegaconf": [("2.4.0", [], {"padding": 2 * 1024 * 1024})],
                                       "setuptools": [("84.2.1", [], {})]})
    small = Image(**{**IMAGE.__dict__, "limit_mib": 3})
    monkeypatch.setattr(gpu_offline, "report_requirements", lambda project: [("omegaconf>=2.3", "inceptionlab")])

    with pytest.raises(OfflineError, match=r"MiB would travel, over the device tool's 3 MiB"):
        gpu_offline.build(tmp_path / "wheels", None, None, small, fetch=index, tree_bytes=1024 * 1024,
                          say=lambda line: None)

    manifest = json.loads((tmp_path / "wheels" / gpu_offline.MANIFEST).read_text())
    assert [w["name"] for w in manifest["wheels"]] == ["omegaconf", "setuptools"]
    assert manifest["bytes"]["tree"] == 1024 * 1024 and "openvino" in manifest["left_out"]


def test_the_report_without_a_wheelhouse_names_the_command_that_makes_one(tmp_path, capsys):
    code = gpu_offline.main(["report", "--wheels", str(tmp_path / "none"), "--out", str(tmp_path / "out"),
                             "--venv", str(tmp_path / "venv")])

    assert code == 2 and "run `make gpu-wheels`" in capsys.readouterr().err


def test_the_venv_sees_the_parent_venvs_packages_and_installs_from_the_wheels_alone(tmp_path):
    """This test's Python is itself a venv, as the GPU image's is: the new venv must see its packages
    (pytest here, torch there), and pip must install from the wheelhouse with no index and no network."""
    python = gpu_offline.make_venv(tmp_path / "venv")
    wheels = tmp_path / "wheels"
    wheel(wheels, "offline-probe", "1.0", ["pytest>=7"])

    seen = subprocess.run([str(python), "-c", "import sys, pytest; print(sys.prefix); print(pytest.__file__)"],
                          capture_output=True, text=True, check=True).stdout.split()
    step = gpu_offline.run_step(gpu_offline.Step("probe", [str(python), "-m", "pip", "install", "-q", "offline-probe"]),
                                gpu_offline.offline_env(wheels), tmp_path / "install.log", timeout=120)

    assert Path(seen[0]) == tmp_path / "venv" and not seen[1].startswith(str(tmp_path))
    assert step.ok, step.tail
    own = {p.name.split("-")[0] for p in (tmp_path / "venv").glob("lib/python3*/site-packages/*.dist-info")}
    assert own == {"offline_probe"}  # pytest came from the parent: nothing else was installed
    absent = gpu_offline.run_step(gpu_offline.Step("absent", [str(python), "-m", "pip", "install", "-q", "left-pad"]),
                                  gpu_offline.offline_env(wheels), tmp_path / "install.log", timeout=120)
    assert not absent.ok and "left-pad" in absent.tail  # not in the wheelhouse: no index to fall back on


def test_pip_is_given_only_what_the_image_does_not_meet(tmp_path):
    """pip re-checks every installed package it is handed: asking for matplotlib again would fail on an
    image whose python-dateutil lacks its tzdata. So the package goes in without dependencies, and each
    group asks only for what is missing."""
    image = {"torch": "2.11.0", "torchvision": "0.26.0", "numpy": "2.5.2", "pyyaml": "6.0.2", "typer": "0.15.1",
             "tqdm": "4.67.1", "matplotlib": "3.10.0", "tensorboard": "2.20.0", "pillow": "11.0.0",
             "tokenizers": "0.23.2", "onnx": "1.23.1", "onnxscript": "0.7.2", "pytest": "8.3.4",
             "httpx": "0.27.0", "prometheus-client": "0.21.0", "grpcio": "1.70.0", "protobuf": "5.29.0"}
    python = tmp_path / "venv" / "bin" / "python"

    steps = {step.name: step for step in gpu_offline.install_steps(python, gpu_offline.pyproject(),
                                                                   version_of=lambda name: image.get(name.lower()))}

    assert steps["inceptionlab"].command[-3:] == ["--no-deps", "-e", str(REPO)] and steps["inceptionlab"].required
    assert steps["dependencies"].command[6:] == ["omegaconf>=2.3"] and steps["dependencies"].required
    assert steps["extra onnx-export"].command == []
    assert steps["extra onnx-export"].met == ["onnx>=1.23", "onnxscript>=0.7"]
    assert steps["extra serve"].command[6:] == ["fastapi>=0.115", "uvicorn>=0.30", "python-multipart>=0.0.9",
                                                "grpcio-health-checking>=1.66", "uvloop>=0.19; sys_platform != 'win32'",
                                                "httptools>=0.6"]
    assert steps["test runner"].command[6:] == ["pytest-timeout>=2.3"] and not steps["test runner"].required
    assert all(step.command[:6] == [str(python), "-m", "pip", "install", "-q", "--no-index"]
               for step in steps.values() if step.command)
    met = gpu_offline.run_step(steps["extra onnx-export"], {}, tmp_path / "log", timeout=1)
    assert met.ok and met.tail == "met by the image: onnx>=1.23, onnxscript>=0.7"


def test_grpc_health_checking_is_carried_in_the_image_grpcio_s_own_version(tmp_path):
    # The H200 image of 2026-12-04 has grpcio 1.84.0 and protobuf 7.36.2: the newest health-checking
    # (1.85.1) needs grpcio >= 1.85.1, the older ones carried beside it protobuf < 7, so pip there found
    # none it could install and the serve extra failed. Its releases track grpcio's: carry that one.
    index = Index(tmp_path, {"grpcio-health-checking": [
        ("1.85.1", ["grpcio>=1.85.1", "protobuf<8.0.0,>=7.35.1"], {}),
        ("1.84.0", ["grpcio>=1.84.0", "protobuf<8.0.0,>=6.31.1"], {}),
        *[(v, [f"grpcio>={v}", "protobuf<7.0.0,>=5.26.1"], {}) for v in ("1.78.0", "1.74.0", "1.70.0", "1.66.2")]]})
    image = Image(**{**IMAGE.__dict__, "packages": {**IMAGE.packages, "grpcio": "1.84.0", "protobuf": "7.36.2"}})

    house = collect([("grpcio-health-checking>=1.66", "extra serve")], image, index,
                    also=gpu_offline.ALSO_CARRY)

    assert not house.conflicts
    assert [w.version for w in house.wheels["grpcio-health-checking"]] == ["1.84.0"]
