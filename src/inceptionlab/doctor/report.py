"""What the doctor reports: one `Check` per finding, the torch build, and the whole `DoctorReport`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

from inceptionlab.torch_build import build_kind, describe_build

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str


@dataclass(frozen=True)
class BuildInfo:
    """What torch was compiled for: CUDA, ROCm (HIP) or CPU only."""

    cuda: str | None
    hip: str | None

    @classmethod
    def from_torch(cls) -> BuildInfo:
        return cls(cuda=torch.version.cuda, hip=getattr(torch.version, "hip", None))

    @property
    def kind(self) -> str:
        return build_kind(self.hip, self.cuda)

    def describe(self) -> str:
        return describe_build(self.hip, self.cuda)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "cuda": self.cuda, "hip": self.hip, "description": self.describe()}


@dataclass
class DoctorReport:
    python: str
    torch: str
    torchvision: str | None
    build: BuildInfo
    devices: list[dict[str, Any]]
    checks: list[Check]
    fix: str | None = None  # the set-up command that gives torch the machine's GPU, when the build is the problem

    @property
    def ok(self) -> bool:
        return not self.failed_checks()

    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "python": self.python,
            "torch": self.torch,
            "torchvision": self.torchvision,
            "build": self.build.to_dict(),
            "devices": self.devices,
            "checks": [asdict(c) for c in self.checks],
            "fix": self.fix,
        }


def one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
