"""Download and unpack archives so that a killed run can simply be run again.

`fetch` resumes a partial download (HTTP Range into `<dest>.part`), verifies the checksum and
only then renames the file into place, so `dest` either holds verified bytes or does not exist.
`safe_extract_zip` refuses members that would land outside the destination and writes each file
under a temporary name before renaming it, so a file at its final name is always complete.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import shutil
import stat
import sys
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from inceptionlab.errors import UserError

CHUNK = 1 << 20


class DownloadError(UserError):
    """The URL could not be fetched (offline, refused, HTTP error). Callers may reword it."""

    def __init__(self, url: str, dest: Path, reason: str):
        self.url, self.dest, self.reason = url, dest, reason
        super().__init__(
            f"could not download {url} ({reason}); download it by hand to {dest} and run again"
        )


def show_progress(wanted: bool) -> bool:
    """Progress bars only on a terminal: they would garble logs and captured output."""
    return wanted and sys.stderr.isatty()


# --- checksums ---------------------------------------------------------------------------------


def file_digest(path: Path, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def checksum_mismatch(path: Path, sha256: str | None, md5: str | None) -> str | None:
    """None when `path` matches every given checksum, else a description of the mismatch."""
    for algorithm, expected in (("sha256", sha256), ("md5", md5)):
        if expected is None:
            continue
        actual = file_digest(path, algorithm)
        if actual.lower() != expected.lower():
            return f"{algorithm} is {actual}, expected {expected}"
    return None


# --- fetch -------------------------------------------------------------------------------------


def part_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def fetch(
    url: str,
    dest: str | os.PathLike,
    sha256: str | None = None,
    md5: str | None = None,
    *,
    progress: bool = True,
    timeout: float = 60.0,
) -> Path:
    """Download `url` to `dest`, resuming `<dest>.part` if a previous run was cut off.

    An existing `dest` is trusted only if it matches the given checksums. A download whose
    checksum does not match is deleted (resuming onto bad bytes could never succeed) and the
    error says so; nothing is left at `dest`.
    """
    dest = Path(dest)
    if dest.exists():
        problem = checksum_mismatch(dest, sha256, md5)
        if problem is None:
            return dest
        # Never delete a file we did not just download: the user may have put it there.
        raise UserError(
            f"{dest} exists but its {problem}; delete it to download it again"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = part_path(dest)
    download_into_part(url, dest, progress=progress, timeout=timeout)
    problem = checksum_mismatch(part, sha256, md5)
    if problem is not None:
        part.unlink()
        raise UserError(
            f"downloaded {url} but its {problem}; removed {part}, nothing was written to {dest}"
            " (run again to retry, or check the URL)"
        )
    os.replace(part, dest)
    return dest


def download_into_part(url: str, dest: Path, *, progress: bool, timeout: float) -> None:
    """Append the missing bytes of `url` to `<dest>.part`, starting over if the server ignores Range."""
    part = part_path(dest)
    offset = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "inceptionlab"})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        # A fresh opener reads the proxy settings (http_proxy, no_proxy) as they are now.
        response = urllib.request.build_opener().open(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:
            return  # the part already holds every byte; the checksum decides if they are right
        raise DownloadError(url, dest, f"HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DownloadError(url, dest, str(reason)) from exc
    with response:
        resuming = offset and response.status == 206 and range_start(response) == offset
        if not resuming:
            offset = 0  # the server sent the whole file: overwrite rather than append to it
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length and length.isdigit() else None
        with open(part, "ab" if resuming else "wb") as out, tqdm(
            total=total,
            initial=offset,
            unit="B",
            unit_scale=True,
            desc=f"download {dest.name}",
            disable=not show_progress(progress),
        ) as bar:
            try:
                for block in iter(lambda: response.read(CHUNK), b""):
                    out.write(block)
                    bar.update(len(block))
            except (OSError, http.client.HTTPException) as exc:
                # What arrived stays in the .part file, so the next run resumes from there.
                raise DownloadError(url, dest, str(exc)) from exc


def range_start(response) -> int | None:
    """First byte offset of a 206 response (`Content-Range: bytes START-END/TOTAL`)."""
    match = re.match(r"bytes (\d+)-", response.headers.get("Content-Range", ""))
    return int(match.group(1)) if match else None


# --- zip extraction ----------------------------------------------------------------------------


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


def member_parts(info: zipfile.ZipInfo) -> list[str]:
    """Path components of a member; backslashes count as separators (archives made on Windows)."""
    return [p for p in re.split(r"[/\\]", info.filename) if p not in ("", ".")]


def unsafe_reason(info: zipfile.ZipInfo) -> str | None:
    """Why a member must not be extracted, or None if it stays inside the destination."""
    name = info.filename
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "has an absolute path"
    if ".." in re.split(r"[/\\]", name):
        return "climbs out with '..'"
    if stat.S_ISLNK(info.external_attr >> 16):
        return "is a symbolic link"
    if not member_parts(info):
        return "has an empty name"
    return None


def check_members(zip_path: Path, members: list[zipfile.ZipInfo]) -> None:
    """Refuse the whole archive before writing anything if one member is unsafe."""
    for info in members:
        reason = unsafe_reason(info)
        if reason:
            raise UserError(
                f"{zip_path}: member {info.filename!r} {reason}; refusing to extract this archive"
            )


def inside(path: Path, root: Path) -> bool:
    """True if `path`, with symlinks resolved, is `root` or below it."""
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


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
        check_members(zip_path, members)
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
            extract_member(archive, info, target, zip_path)
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


def extract_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path, zip_path: Path) -> None:
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
