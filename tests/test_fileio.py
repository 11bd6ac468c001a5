"""fileio.py: the one atomic writer."""

from __future__ import annotations

import os

import pytest

from inceptionlab import fileio
from inceptionlab.fileio import atomic_write_json, atomic_write_text


@pytest.fixture
def umask():
    """Set the process umask for one test, then restore it."""
    previous = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_atomic_files_get_the_mode_the_umask_gives(tmp_path, umask, mask, mode):
    umask(mask)
    path = tmp_path / "new" / "model.onnx.json"
    atomic_write_json(path, {"a": 1})
    assert path.stat().st_mode & 0o777 == mode
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o777 & ~mask


def test_a_replaced_file_keeps_its_mode(tmp_path, umask):
    path = tmp_path / "spec.json"
    path.write_text("old")
    path.chmod(0o640)
    atomic_write_text(path, "new")
    assert path.read_text() == "new" and path.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["spec.json"]  # no temporary file left behind


def test_the_umask_is_read_without_changing_it(umask):
    umask(0o027)
    assert fileio.current_umask() == 0o027 and os.umask(0o027) == 0o027
