"""One pass over the files: what each one is, read as cheaply as the checks allow.

Per file: its bytes' SHA-256 (exact copies), whether it decodes, format, mode, size, and two perceptual
hashes of its pixels (near copies: resized or re-encoded). Decoding is the cost, so it is cut down:
a JPEG is decoded at reduced size in its DCT (PIL's draft mode, 1/2 to 1/8 scale: the hashes look at
32 x 32 pixels anyway), and files are spread over a process pool (hardware.usable_cpus()).

Hashes (the `imagehash` package): pHash (DCT of a 32 x 32 grey image, 64 bits) finds a picture again
after resizing and re-encoding; dHash (gradients of a 9 x 8 grey image, 64 bits) confirms it, so two
different photos that share a pHash by chance are not called copies (checks.py).
"""

from __future__ import annotations

import hashlib
import io
import multiprocessing
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
from PIL import Image, UnidentifiedImageError

from inceptionlab.data.io.decode import ImageReadError, open_image

DRAFT_SIDE = 64  # px: JPEGs are decoded at the smallest DCT scale still >= this (hashes use 32 x 32)
CHUNK = 64  # files per task sent to a worker: amortises the pool's per-task cost (~0.1 ms)


@dataclass
class FileFacts:
    path: str
    bytes: int
    sha256: str
    error: str | None = None  # why it cannot be decoded
    needs_reader: bool = False  # a format this installation has no reader for (HEIC without pillow-heif)
    format: str | None = None
    mode: str | None = None
    width: int = 0
    height: int = 0
    phash: int = 0  # 64-bit perceptual hash (unsigned, as a Python int)
    dhash: int = 0
    std: float | None = None  # grey-level standard deviation (0-255): ~0 for a flat image

    @property
    def decoded(self) -> bool:
        return self.error is None


def _hash_int(value: object) -> int:
    """imagehash's boolean array -> the 64 bits as an int."""
    return int.from_bytes(np.packbits(value.hash.flatten()).tobytes(), "big")  # type: ignore[attr-defined]


def hashes_available() -> bool:
    try:
        import imagehash  # noqa: F401  (the check extra)
    except ImportError:
        return False
    return True


def scan_file(path: str, hashes: bool = True) -> FileFacts:
    """The facts of one file; a file that cannot be read or decoded gets `error`, never an exception."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        return FileFacts(path, 0, "", error=f"cannot read: {exc.strerror or exc}")
    facts = FileFacts(path, len(data), hashlib.sha256(data).hexdigest())
    if not data:
        facts.error = "empty file (0 bytes)"
        return facts
    try:
        with open_image(io.BytesIO(data), Path(path)) as image:
            facts.format, facts.mode, (facts.width, facts.height) = image.format, image.mode, image.size
            if image.format == "JPEG":
                image.draft("RGB" if image.mode not in ("L", "CMYK") else image.mode, (DRAFT_SIDE, DRAFT_SIDE))
            image.load()  # decodes all of it (at the drafted scale): truncated and corrupt files fail here
            grey = image.convert("L")
            facts.std = float(np.asarray(grey, dtype=np.float32).std())
            if hashes:
                import imagehash  # the check extra; imported once per worker process

                facts.phash, facts.dhash = _hash_int(imagehash.phash(grey)), _hash_int(imagehash.dhash(grey))
    except ImageReadError as exc:  # a format this installation cannot read: the problem says what would
        facts.error, facts.needs_reader = exc.problem, True
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        facts.error = _decode_error(exc)
    return facts


def _decode_error(exc: BaseException) -> str:
    if isinstance(exc, UnidentifiedImageError):
        return "not an image, or a format PIL cannot read"
    if isinstance(exc, Image.DecompressionBombError):
        return "too many pixels to decode safely (PIL's decompression-bomb limit)"
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"cannot be decoded ({text})"


def _scan_chunk(task: tuple[list[str], bool]) -> list[FileFacts]:
    paths, hashes = task
    return [scan_file(p, hashes) for p in paths]


def _chunks(paths: list[str], size: int, hashes: bool) -> Iterator[tuple[list[str], bool]]:
    for start in range(0, len(paths), size):
        yield paths[start:start + size], hashes


def scan_files(paths: list[str], workers: int, on_progress: Callable[[int], None] | None = None,
               hashes: bool = True) -> list[FileFacts]:
    """Facts of every file, in the order given; `workers` processes (0: in this process)."""
    results: list[FileFacts] = []

    def collect(chunks: Iterable[list[FileFacts]]) -> None:
        for chunk in chunks:
            results.extend(chunk)
            if on_progress is not None:
                on_progress(len(chunk))

    if workers <= 0 or len(paths) < 2 * CHUNK:
        collect(_scan_chunk(chunk) for chunk in _chunks(paths, CHUNK, hashes))
        return results
    if hashes:
        import imagehash  # noqa: F401  imported before the fork, so each worker inherits it (~0.5 s each)
    # fork where the platform has it: the workers inherit what this process imported
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with multiprocessing.get_context(method).Pool(workers) as pool:
        collect(pool.imap(_scan_chunk, _chunks(paths, CHUNK, hashes)))
    return results
