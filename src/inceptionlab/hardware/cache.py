"""The speed cache: measured images/s per candidate, one JSON file per machine, torch version, model,
input, batch and thread count (`CacheKey`), so a second run decides instantly."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from inceptionlab.fileio import atomic_write_json
from inceptionlab.hardware.facts import DeviceFacts

log = logging.getLogger(__name__)


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """$INCEPTIONLAB_CACHE, else $XDG_CACHE_HOME/inceptionlab, else ~/.cache/inceptionlab."""
    env = os.environ if env is None else env
    if env.get("INCEPTIONLAB_CACHE"):
        return Path(env["INCEPTIONLAB_CACHE"])
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inceptionlab"


@dataclass(frozen=True)
class CacheKey:
    """Everything a measured speed depends on. A change in any field means measuring again."""

    purpose: str  # train | infer
    device: str  # cpu | cuda | rocm
    device_name: str
    arch: str
    bf16: bool
    torch: str
    model: str
    input_shape: tuple[int, ...]
    batch: int
    threads: int
    extra: str = ""  # e.g. the runtime for inference decisions

    def digest(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:20]


def make_key(purpose: str, facts: DeviceFacts, model: str, input_shape: Iterable[int], batch: int,
             threads: int | None = None, extra: str = "") -> CacheKey:
    import torch  # start-up time: the package is imported before torch

    threads = torch.get_num_threads() if threads is None else threads
    return CacheKey(purpose, facts.kind, facts.name, facts.arch, facts.bf16, torch.__version__, model,
                    tuple(int(x) for x in input_shape), int(batch), 0 if facts.is_gpu else int(threads), extra)


@dataclass
class SpeedCache:
    """Measured images/s per candidate, one JSON file per key (atomic writes: parallel runs never
    corrupt it, a later writer only adds figures)."""

    root: Path = field(default_factory=lambda: cache_root() / "speed")

    def path(self, key: CacheKey) -> Path:
        return self.root / f"{key.purpose}-{key.digest()}.json"

    def load(self, key: CacheKey) -> dict[str, float]:
        """Images/s per candidate label measured under `key`."""
        return {label: float(v) for label, v in self._read(key).get("img_per_s", {}).items()}

    def failures(self, key: CacheKey) -> dict[str, str]:
        """Why each candidate that failed (or was too slow) under `key` gave no figure."""
        return {label: str(why) for label, why in self._read(key).get("failed", {}).items()}

    def _read(self, key: CacheKey) -> dict[str, Any]:
        path = self.path(key)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            log.warning("ignoring unreadable speed cache %s", path, exc_info=True)
            return {}
        if not isinstance(data, dict) or data.get("key") != _key_dict(key):  # a hash collision or an edited file
            return {}
        return data

    def store(self, key: CacheKey, measured: Mapping[str, float], failed: Mapping[str, str] | None = None) -> None:
        """Add figures and failures to what is there; a candidate's latest outcome replaces its earlier one."""
        failed = dict(failed or {})
        figures = {label: v for label, v in self.load(key).items() if label not in failed}
        figures.update(measured)
        failures = {label: why for label, why in self.failures(key).items() if label not in measured}
        failures.update(failed)
        try:
            atomic_write_json(self.path(key), {"key": _key_dict(key), "img_per_s": figures, "failed": failures,
                                               "time": time.strftime("%Y-%m-%dT%H:%M:%S")})
        except OSError:  # a read-only home: decide again next time, but say so once
            log.warning("could not write the speed cache under %s", self.root, exc_info=True)

    def entries(self) -> Iterator[dict[str, Any]]:
        for path in sorted(self.root.glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                yield json.loads(path.read_text())


def _key_dict(key: CacheKey) -> dict[str, Any]:
    data = asdict(key)
    data["input_shape"] = list(key.input_shape)
    return data
