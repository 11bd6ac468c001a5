"""Unpack zip and tar archives safely, so that a killed run can simply be run again.

Both formats pass every member through one check, `member_problem`, before anything is written:
no absolute paths, no `..`, no links or special files, no empty names. A refused member refuses
the whole archive. Files only ever appear under their final name complete:

- `safe_extract_zip` writes each member under a hidden temporary name and renames it, and skips
  members already present with the right size, so a re-run finishes what a killed one started.
- `safe_extract_tar` streams the archive once into a hidden staging folder (with tarfile's "data"
  filter as a second line of defence) and renames its files into place only when all of it is out.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from inceptionlab.data.io.download import CHUNK, show_progress
from inceptionlab.errors import UserError

# What a member is, in the words `member_problem` takes (zip and tar members both map to these).
MEMBER_KINDS = ("file", "dir", "symlink", "hardlink", "special")


def member_problem(name: str, kind: str) -> str | None:
    """Why an archive member must not be extracted, or None if it is a plain file or folder inside.

    Backslashes count as separators too (archives made on Windows).
    """
    if kind not in MEMBER_KINDS:
        raise ValueError(f"kind {kind!r} is not one of {MEMBER_KINDS}")
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "has an absolute path"
    parts = re.split(r"[/\\]", name)
    if ".." in parts:
        return "climbs out with '..'"
    if kind == "symlink":
        return "is a symbolic link"  # it could point anywhere; no dataset here ships one
    if kind == "hardlink":
        return "is a hard link"
    if kind == "special":
        return "is a special file (device or pipe)"
    if not [p for p in parts if p not in ("", ".")]:
        return "has an empty name"
    return None


def refuse(archive: Path, name: str, problem: str) -> UserError:
    return UserError(f"{archive}: member {name!r} {problem}; refusing to extract this archive")


def inside(path: Path, root: Path) -> bool:
    """True if `path`, with symlinks resolved, is `root` or below it."""
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


# --- zip ---------------------------------------------------------------------------------------


@dataclass
class ExtractReport:
    files: int  # regular files in the archive
    extracted: int  # written by this run
    skipped: int  # already present with the right size, or excluded by the caller


def open_zip(zip_path: Path) -> zipfile.ZipFile:
    if not zip_path.is_file():
        raise UserError(f"archive {zip_path} not found; check the path")
    try:
        return zipfile.ZipFile(zip_path)
    except zipfile.BadZipFile as exc:
        raise UserError(f"{zip_path} is not a valid zip archive ({exc}); download it again") from exc


def zip_member_kind(info: zipfile.ZipInfo) -> str:
    if stat.S_ISLNK(info.external_attr >> 16):
        return "symlink"
    return "dir" if info.is_dir() else "file"


def member_parts(info: zipfile.ZipInfo) -> list[str]:
    """Path components of a member; backslashes count as separators (archives made on Windows)."""
    return [p for p in re.split(r"[/\\]", info.filename) if p not in ("", ".")]


def check_zip_members(zip_path: Path, members: list[zipfile.ZipInfo]) -> None:
    """Refuse the whole archive before writing anything if one member is unsafe."""
    for info in members:
        problem = member_problem(info.filename, zip_member_kind(info))
        if problem:
            raise refuse(zip_path, info.filename, problem)


def safe_extract_zip(
    zip_path: str | os.PathLike,
    dest_dir: str | os.PathLike,
    *,
    skip: Callable[[str], bool] | None = None,
    progress: bool = True,
) -> ExtractReport:
    """Extract `zip_path` into `dest_dir`; safe to re-run after being killed.

    Members already present with the right size are skipped (a file only ever appears under its
    final name complete, thanks to write-then-rename). `skip(member_name)` lets the caller leave
    out members it has already dealt with (e.g. files it has since moved).
    """
    zip_path, dest_dir = Path(zip_path), Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    with open_zip(zip_path) as archive:
        members = archive.infolist()
        check_zip_members(zip_path, members)
        files = [m for m in members if not m.is_dir()]
        extracted = skipped = 0
        for info in members:
            if info.is_dir():
                make_dir_inside(dest_dir.joinpath(*member_parts(info)), dest_dir, zip_path, info)
        for info in tqdm(files, desc=f"extract {zip_path.name}", unit="file",
                         disable=not show_progress(progress)):
            target = dest_dir.joinpath(*member_parts(info))
            if (skip and skip(info.filename)) or already_extracted(target, info):
                skipped += 1
                continue
            make_dir_inside(target.parent, dest_dir, zip_path, info)
            extract_zip_member(archive, info, target, zip_path)
            extracted += 1
    return ExtractReport(files=len(files), extracted=extracted, skipped=skipped)


def make_dir_inside(path: Path, dest_dir: Path, zip_path: Path, info: zipfile.ZipInfo) -> None:
    path.mkdir(parents=True, exist_ok=True)
    # A symlink already in dest_dir could redirect a harmless-looking member elsewhere.
    if not inside(path, dest_dir):
        raise UserError(
            f"{zip_path}: member {info.filename!r} would be written through a symlink outside "
            f"{dest_dir}; remove that link and run again"
        )


def already_extracted(target: Path, info: zipfile.ZipInfo) -> bool:
    try:
        st = target.lstat()
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == info.file_size


def extract_zip_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path, zip_path: Path) -> None:
    """Write to a hidden temporary name, then rename: the final name never holds a partial file."""
    tmp = target.with_name(f".{target.name}.extracting")
    try:
        with archive.open(info) as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, CHUNK)
    except zipfile.BadZipFile as exc:  # raised on CRC mismatch at the end of the member
        tmp.unlink(missing_ok=True)
        raise UserError(
            f"{zip_path}: member {info.filename!r} is corrupt ({exc}); download the archive again"
        ) from exc
    os.replace(tmp, target)


# --- tar ---------------------------------------------------------------------------------------


def tar_member_kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return "symlink"
    if member.islnk():
        return "hardlink"
    return "file" if member.isfile() else "dir" if member.isdir() else "special"


def check_tar_member(tar_path: Path, member: tarfile.TarInfo, staging: Path) -> None:
    problem = member_problem(member.name, tar_member_kind(member))
    if problem is None and not inside(staging / member.name, staging):
        problem = "would land outside the destination"
    if problem:
        raise refuse(tar_path, member.name, problem)


def safe_extract_tar(tar_path: str | os.PathLike, dest_dir: str | os.PathLike) -> Path:
    """Extract a (compressed) tar into `dest_dir` safely; re-running after a crash completes it.

    Members are checked one by one (`member_problem`) and extracted with tarfile's "data" filter
    into a hidden staging folder inside `dest_dir`; only when the whole archive is out are its
    files renamed into place, so a killed run never leaves a partial file under a final name. A
    refused member aborts everything and nothing reaches `dest_dir`.
    """
    tar_path, dest_dir = Path(tar_path), Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    staging = dest_dir / f".{tar_path.name}.extracting"
    shutil.rmtree(staging, ignore_errors=True)  # left behind by a run that was killed
    staging.mkdir()
    try:
        extract_tar_into(tar_path, staging)
        move_into_place(staging, dest_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest_dir


def extract_tar_into(tar_path: Path, staging: Path) -> None:
    try:
        # Stream mode reads the archive once; the check runs before each member is written.
        with tarfile.open(tar_path, "r|*") as archive:
            for member in archive:
                check_tar_member(tar_path, member, staging)
                archive.extract(member, staging, filter="data")
    except tarfile.FilterError as exc:
        raise UserError(f"{tar_path}: {exc}; refusing to extract this archive") from exc
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise UserError(f"{tar_path} is truncated or corrupt ({exc}); delete it and download it again") from exc


def move_into_place(source: Path, dest: Path) -> None:
    """Rename everything under `source` into `dest`, merging into folders that already exist."""
    for entry in sorted(source.iterdir()):
        target = dest / entry.name
        if not inside(target, dest):
            raise UserError(f"{target} is a link leading outside {dest}; remove it and run again")
        if entry.is_dir() and target.is_dir():
            move_into_place(entry, target)
        else:
            os.replace(entry, target)  # atomic: the target is the old or the new file, never half
