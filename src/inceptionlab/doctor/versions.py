"""Versions: Python, torch and its build, and a torchvision that imports and pairs with this torch."""

from __future__ import annotations

import importlib
import platform
from collections.abc import Callable
from typing import Any

import torch

from inceptionlab.doctor.report import BuildInfo, Check, one_line


def python_check() -> Check:
    version = platform.python_version()
    return Check("python", "ok", f"{version} ({platform.python_implementation()})")


def torch_check(build: BuildInfo) -> Check:
    return Check("torch", "ok", f"{torch.__version__} ({build.describe()})")


def torchvision_check(
    torch_version: str, importer: Callable[[str], Any] = importlib.import_module
) -> tuple[Check, str | None]:
    """Import torchvision; a failure (often an ABI mismatch with torch) is a failing check."""
    fix = f"install the torchvision that matches torch {torch_version}"
    try:
        torchvision = importer("torchvision")
    except Exception as exc:
        return Check("torchvision", "fail", f"import failed: {one_line(exc)}; {fix}"), None
    version = str(getattr(torchvision, "__version__", "unknown"))
    mismatch = _torchvision_mismatch(torch_version, version)
    if mismatch:
        return Check("torchvision", "warn", f"{version}: {mismatch}; {fix}"), version
    return Check("torchvision", "ok", version), version


def _torchvision_mismatch(torch_version: str, torchvision_version: str) -> str | None:
    torch_public, _, torch_local = torch_version.partition("+")
    tv_public, _, tv_local = torchvision_version.partition("+")
    if torch_local and tv_local and torch_local != tv_local:
        return f"built for +{tv_local} but torch is +{torch_local}"
    # Since torch 2.0 / torchvision 0.15 each torch 2.N release pairs with torchvision 0.(N+15).
    torch_parts, tv_parts = torch_public.split("."), tv_public.split(".")
    if len(torch_parts) >= 2 and len(tv_parts) >= 2 and torch_parts[0] == "2" and tv_parts[0] == "0":
        if torch_parts[1].isdigit() and tv_parts[1].isdigit():
            expected = int(torch_parts[1]) + 15
            if int(tv_parts[1]) != expected:
                return f"torch {torch_public} pairs with torchvision 0.{expected}"
    return None


def build_check(build: BuildInfo) -> Check:
    return Check("build", "ok", build.describe())
