"""Zip and tar members pass one safety check: the same hostile member is refused by both, with the same reason."""

from __future__ import annotations

import io
import re
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from inceptionlab.data.io.archives import member_problem, safe_extract_tar, safe_extract_zip
from inceptionlab.errors import UserError


def write_zip(path: Path, name: str, symlink: bool) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("ok.txt", b"fine")
        info = zipfile.ZipInfo(name)
        if symlink:
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(info, "/etc/passwd" if symlink else "pwned")
    return path


def write_tar(path: Path, name: str, symlink: bool) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        ok = tarfile.TarInfo("ok.txt")
        ok.size = 4
        archive.addfile(ok, io.BytesIO(b"fine"))
        info = tarfile.TarInfo(name)
        if symlink:
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            archive.addfile(info)
        else:
            info.size = 5
            archive.addfile(info, io.BytesIO(b"pwned"))
    return path


HOSTILE = [
    ("../evil.txt", False, "climbs out with '..'"),
    ("ok/..\\..\\evil.txt", False, "climbs out with '..'"),  # a Windows separator counts too
    ("/abs/evil.txt", False, "has an absolute path"),
    ("C:evil.txt", False, "has an absolute path"),
    ("evil-link", True, "is a symbolic link"),
]


@pytest.mark.parametrize("name, symlink, reason", HOSTILE)
@pytest.mark.parametrize("fmt", ["zip", "tar"])
def test_zip_and_tar_refuse_the_same_member_for_the_same_reason(tmp_path, fmt, name, symlink, reason):
    if fmt == "zip":
        archive, extract = write_zip(tmp_path / "bad.zip", name, symlink), safe_extract_zip
    else:
        archive, extract = write_tar(tmp_path / "bad.tar.gz", name, symlink), safe_extract_tar
    dest = tmp_path / "out" / "dest"
    with pytest.raises(UserError, match=re.escape(f"member {name!r} {reason}; refusing")):
        extract(archive, dest, **({"progress": False} if fmt == "zip" else {}))
    assert not (dest / "ok.txt").exists()  # refused before anything reached the destination
    assert not list(tmp_path.rglob("evil*"))


def test_plain_members_pass_and_special_files_do_not():
    assert member_problem("a/b/c.txt", "file") is None
    assert member_problem("a/b/", "dir") is None
    assert member_problem("fifo", "special") == "is a special file (device or pipe)"
    assert member_problem("copy", "hardlink") == "is a hard link"
    assert member_problem("./", "dir") == "has an empty name"
