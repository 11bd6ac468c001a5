"""Shared fixtures: run the CLI in-process, locate the real data in ../shared/data."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("INCEPTIONLAB_SHARED_DATA", REPO.parent / "shared" / "data"))


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys):
    """Run `inceptionlab ARGS...` in-process; returns exit code, stdout and stderr."""
    from inceptionlab.cli import main

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def shared_data(name: str) -> Path:
    """Path to a real dataset in ../shared/data, or skip the test with the reason."""
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"real data {path} is absent (set INCEPTIONLAB_SHARED_DATA to its folder)")
    return path
