"""Download files so that a killed run can simply be run again.

`fetch` resumes a partial download (HTTP Range into `<dest>.part`), verifies the checksum and
only then renames the file into place, so `dest` either holds verified bytes or does not exist.
Unpacking is `archives.py`'s.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import sys
import urllib.error
import urllib.request
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
