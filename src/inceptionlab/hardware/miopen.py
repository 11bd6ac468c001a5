"""What must be set before torch is imported: MIOpen's databases and kernel caches in a persistent,
writable, per-ROCm-version folder."""

from __future__ import annotations

import logging
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Mapping

from inceptionlab.hardware.cache import cache_root

log = logging.getLogger(__name__)

# MIOpen keeps its find-database and compiled kernels under ~/.config/miopen and ~/.cache/miopen by
# default: NFS homes, read-only homes and parallel jobs writing one file corrupt them, and a ROCm
# upgrade reads the old version's kernels. One persistent, writable, per-user folder per ROCm version.
MIOPEN_VARS = ("MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR")


def rocm_build_tag(torch_version: str | None = None) -> str | None:
    """'rocm6.2' from torch's version string ('2.5.1+rocm6.2'), read without importing torch."""
    if torch_version is None:
        try:
            torch_version = version("torch")
        except PackageNotFoundError:
            return None
    local = torch_version.partition("+")[2]
    return local if local.startswith("rocm") else None


def miopen_environment(env: Mapping[str, str], torch_version: str | None = None) -> dict[str, str]:
    """The MIOpen variables to set before torch is imported: none on non-ROCm builds, none the user set."""
    tag = rocm_build_tag(torch_version)
    if tag is None or any(var in env for var in MIOPEN_VARS):
        return {}
    home = cache_root(env) / "miopen" / tag
    return {"MIOPEN_USER_DB_PATH": str(home / "db"), "MIOPEN_CUSTOM_CACHE_DIR": str(home / "kernels")}


def prepare_process_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """Set what must be set before torch is imported (the CLI calls this first); returns what it set."""
    env = os.environ if env is None else env  # type: ignore[assignment]
    chosen = miopen_environment(env)
    for name, path in chosen.items():
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
        except OSError:  # not writable: leave MIOpen on its defaults
            log.warning("cannot create %s for %s; MIOpen keeps its default", path, name)
            return {}
    env.update(chosen)
    return chosen
