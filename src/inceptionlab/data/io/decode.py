"""Read any image file as an upright 8-bit RGB picture, or fail with a one-line error.

`load_rgb` is the single entry point for `inceptionlab predict` and the training datasets, so
every quirk of real-world files is handled here once: odd pixel modes (palette, alpha, CMYK,
16-bit, float, 1-bit), phone photos stored sideways with an EXIF orientation tag, truncated
downloads, text files with an image extension, images too large to decode safely, and the formats
phones and browsers save in (HEIC/HEIF with pillow-heif, AVIF with Pillow >= 11.3; without them
the error says what to install).
`decode_rgb` does the same for bytes already in memory (an upload to the server).

Which files count as images, and how folders are walked for them, is `image_files.py`'s.
"""

from __future__ import annotations

import io
import os
import re
import functools
import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np
import PIL
from PIL import Image, ImageOps, UnidentifiedImageError

from inceptionlab.errors import UserError

__all__ = ["ImageReadError", "UnreadableFile", "decode_rgb", "load_rgb", "open_image"]

# Transparent pixels are composited onto white: logos, icons and product shots with alpha are
# drawn to be seen on a white page, and the RGB hidden under alpha=0 is often black or junk.
BACKGROUND = (255, 255, 255)

# What PIL raises while decoding a damaged file: truncated data (OSError), broken headers or
# chunks (SyntaxError, struct.error, IndexError), unexpected end of data (EOFError), and bad
# field values (ValueError). UnidentifiedImageError is an OSError, so it is caught before these.
_CORRUPT_DATA_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, struct.error)


# Major brands of the ISO base media files (bytes 8-12, after the box type `ftyp` at 4-8) that hold
# HEIF stills and sequences (an iPhone's HEIC is `heic`) and AVIF. PIL identifies HEIF only once
# pillow-heif registers its opener, and AVIF from Pillow 11.3 (built with libavif).
_HEIF_BRANDS = frozenset({b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1"})
_AVIF_BRANDS = frozenset({b"avif", b"avis"})
HEIF_INSTALL = "pip install 'inceptionlab[heif]'"

# Spelled out: testing for an "A" band would also match LAB (bands L, A, B).
_ALPHA_MODES = ("RGBA", "RGBa", "LA", "La", "PA")


class ImageReadError(UserError):
    """An image file that cannot be used; the one-line message names the file and the fix.

    A `UserError`, so the CLI prints `error: <message>` instead of a traceback. `problem` is the
    reason alone ("image too large: 15000 x 13000 pixels"), for lists of skipped files.
    """

    def __init__(self, message: str, path: str = "", problem: str = ""):
        super().__init__(message)
        self.path, self.problem = path, problem or message


class UnreadableFile(str):
    """The path of a file that training or evaluation skipped, with `problem` saying why.

    A `str` (it compares, hashes, sorts and prints as the path), so every list of skipped files keeps
    working while the reason travels with it, through DataLoader workers too (pickled with it).
    """

    problem: str

    def __new__(cls, path: str, problem: str = "") -> "UnreadableFile":
        made = super().__new__(cls, path)
        made.problem = problem
        return made

    def __getnewargs__(self) -> tuple[str, str]:  # type: ignore[override]
        return str(self), self.problem

    @classmethod
    def from_error(cls, exc: ImageReadError, path: str | os.PathLike[str]) -> "UnreadableFile":
        return cls(str(path), exc.problem)

    def describe(self) -> str:
        return f"{self}: {self.problem}" if self.problem else str(self)


# ---------------------------------------------------------------------------------------------
# load_rgb


def load_rgb(path: str | os.PathLike[str], max_side: int | None = None) -> Image.Image:
    """Open, fully decode and return the image at `path` as upright 8-bit RGB.

    `max_side` is a decoding hint for JPEGs: they are decoded at a reduced scale (1/2, 1/4 or
    1/8) whose shorter side is still at least `max_side`, which makes huge photos cheap to read
    when they will be resized down anyway. Other formats are decoded at full size; the caller
    resizes.

    Raises ImageReadError for a missing file, a directory, an unreadable file, a file that is not
    an image, a truncated or corrupt image, and one above PIL's decompression-bomb limit.
    """
    path = Path(path)
    if max_side is not None and max_side < 1:
        raise ValueError(f"max_side must be a positive number of pixels, got {max_side}")
    with _open_file(path) as fp:
        image = _decode(fp, path, max_side)
        # Inside the `with`: some formats read the EXIF block lazily from the file.
        image = _apply_exif_orientation(image)
    return _to_rgb(image)


def decode_rgb(data: bytes, name: str = "<upload>", max_side: int | None = None,
               max_pixels: int | None = None) -> Image.Image:
    """`load_rgb` for bytes already in memory (an upload to the server): same checks, same errors;
    `name` stands for the path in the one-line message. `max_pixels` refuses a larger image from its
    header, before anything is decoded (the server's limit, stricter than PIL's own)."""
    fp = io.BytesIO(data)
    image = _apply_exif_orientation(_decode(fp, Path(name), max_side, max_pixels))
    return _to_rgb(image)


def _open_file(path: Path) -> BinaryIO:
    """Open the file ourselves, so OS errors get their own messages and the handle is closed
    even for multi-frame formats (GIF, TIFF) that PIL would otherwise keep open."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        if path.is_symlink():
            raise _error(path, f"broken link to {os.readlink(path)}", "fix or remove the link") from None
        raise _error(path, "no such file", "check the path") from None
    except IsADirectoryError:
        raise _directory_error(path) from None
    except PermissionError:
        if path.is_dir():  # Windows reports a directory as a permission error
            raise _directory_error(path) from None
        raise _error(path, "permission denied", "make the file readable") from None
    except OSError as exc:
        raise _error(path, f"cannot open file ({exc.strerror or exc})", "check the file") from exc
    if os.fstat(handle.fileno()).st_size == 0:
        handle.close()
        raise _error(path, "empty file (0 bytes)", "re-download or re-export it")
    return handle


def _decode(fp: BinaryIO, path: Path, max_side: int | None, max_pixels: int | None = None) -> Image.Image:
    """Identify and fully decode the image, so a damaged file fails here and never later."""
    try:
        # Between MAX_IMAGE_PIXELS and twice that PIL only warns (such images are fine to classify);
        # the CLI silences that warning once for its process (cli/app.py quiet_image_warnings): a
        # filter swapped per call here would race between the server's decoding threads.
        image = open_image(fp, path)
        width, height = image.size
        if max_pixels is not None and width * height > max_pixels:
            raise _error(path, f"{width} x {height} pixels is above the {max_pixels:,}-pixel limit",
                         "downscale it first")
        if max_side is not None:
            # Only JPEG (and MPO, its multi-picture variant) implements draft; it is a no-op
            # elsewhere. The JPEG decoder then scales by 1/2..1/8 at no extra cost.
            image.draft("RGB", (max_side, max_side))
        image.load()
    except Image.DecompressionBombError as exc:
        size = _describe_size(fp, exc)
        raise _error(path, f"image too large: {size}", "downscale it first") from exc
    except UnidentifiedImageError as exc:
        raise _error(
            path, "not an image, or a format PIL cannot read", "convert it to JPEG or PNG"
        ) from exc
    except _CORRUPT_DATA_ERRORS as exc:
        problem = f"image data is truncated or corrupt ({_one_line(exc)})"
        raise _error(path, problem, "re-download or re-export it") from exc
    return image


def open_image(fp: BinaryIO, path: Path) -> Image.Image:
    """Image.open (lazy: header only), and for a HEIF file PIL does not know yet, again with pillow-heif's
    opener; a HEIF or AVIF file this installation cannot read is an ImageReadError whose `problem` says
    what would read it. Other files raise as Image.open does. Every reader of image files opens them here
    (load_rgb, decode_rgb, the data check's scan), so a format is read everywhere or nowhere."""
    try:
        return Image.open(fp)
    except UnidentifiedImageError:
        brand = _iso_brand(fp)
        if brand in _HEIF_BRANDS:
            if not _heif_registered():
                raise _error(path, f"a HEIC/HEIF photo, which needs pillow-heif ({HEIF_INSTALL})",
                             "or convert it to JPEG") from None
            fp.seek(0)
            return Image.open(fp)
        if brand in _AVIF_BRANDS:
            raise _error(path, f"an AVIF image, which needs Pillow >= 11.3 (this is {PIL.__version__}: "
                               "pip install -U pillow)", "or convert it to JPEG") from None
        raise


def _iso_brand(fp: BinaryIO) -> bytes | None:
    """The major brand of an ISO base media file (HEIF, AVIF, MP4), None for any other file."""
    fp.seek(0)
    head = fp.read(12)
    return head[8:12] if len(head) == 12 and head[4:8] == b"ftyp" else None


@functools.cache
def _heif_registered() -> bool:
    """Register pillow-heif's opener with PIL on the first HEIF file met: importing it (22 ms after PIL on a
    2-core AMD EPYC) is left to the runs that meet one. Two decoding threads of the server racing here at
    most register it twice, which PIL's registry takes as once."""
    try:
        import pillow_heif  # optional extra (heif)
    except ImportError:
        return False
    pillow_heif.register_heif_opener()
    return True


def _apply_exif_orientation(image: Image.Image) -> Image.Image:
    """Rotate/flip as the EXIF orientation tag says, so phone photos come out upright."""
    try:
        # Broken EXIF blocks are common in phone/editor output; PIL warns about them per file (the CLI
        # silences those warnings once, like the decompression-bomb one above).
        ImageOps.exif_transpose(image, in_place=True)
    except Exception:  # noqa: BLE001 - metadata is optional
        # The pixels decoded fine; unreadable metadata must not reject a usable photo, so keep
        # the image as stored.
        pass
    return image


def _to_rgb(image: Image.Image) -> Image.Image:
    """Convert any PIL mode to 8-bit RGB, each the way that keeps the picture recognisable."""
    mode = image.mode
    if mode == "I" or mode.startswith("I;16"):
        return _gray_to_rgb(_scale_16bit_to_8bit(np.asarray(image)))
    if mode == "F":
        return _gray_to_rgb(_scale_float_to_8bit(np.asarray(image)))
    if _has_transparency(image):
        return _composite_on_background(image)
    if mode == "RGB":
        return image
    # L, 1, CMYK, YCbCr, HSV: PIL's own conversions are correct for these.
    return image.convert("RGB")


def _has_transparency(image: Image.Image) -> bool:
    """True for alpha modes, for every palette image (its palette may hold alpha values), and for
    L/RGB images that mark one colour as transparent (PNG tRNS)."""
    return image.mode in _ALPHA_MODES or image.mode == "P" or "transparency" in image.info


def _composite_on_background(image: Image.Image) -> Image.Image:
    """Flatten transparency onto BACKGROUND, going through RGBA so palette and colour-key
    transparency are honoured too."""
    rgba = image.convert("RGBA")
    flat = Image.new("RGB", rgba.size, BACKGROUND)
    flat.paste(rgba, mask=rgba.getchannel("A"))
    return flat


def _scale_16bit_to_8bit(values: np.ndarray) -> np.ndarray:
    """Map 0..65535 to 0..255, rounding (x / 257 exactly).

    PIL's convert("L") clips instead, so everything above 255 - most of a 16-bit image - would
    turn white. Mode I (32-bit) is read from 16-bit PNG/PGM files too, so it gets the same
    range; values outside it are clipped.
    """
    wide = np.clip(values, 0, 65535).astype(np.uint32)
    return ((wide + 128) // 257).astype(np.uint8)


def _scale_float_to_8bit(values: np.ndarray) -> np.ndarray:
    """Floats all within 0..1 are fractions of full scale; anything else follows PIL's 0..255
    convention and is clipped. NaN becomes black."""
    values = np.nan_to_num(values.astype(np.float64), nan=0.0, posinf=255.0, neginf=0.0)
    if values.size and values.min() >= 0.0 and values.max() <= 1.0:
        values = values * 255.0
    return np.rint(np.clip(values, 0.0, 255.0)).astype(np.uint8)


def _gray_to_rgb(gray: np.ndarray) -> Image.Image:
    return Image.fromarray(np.ascontiguousarray(gray), mode="L").convert("RGB")


def _describe_size(fp: BinaryIO, exc: Exception) -> str:
    """'W x H pixels' from the file header, or PIL's pixel count if the header can't be re-read."""
    size = _header_size(fp)
    if size is not None:
        return f"{size[0]} x {size[1]} pixels"
    match = re.search(r"\((\d+) pixels\)", str(exc))
    return f"{match.group(1)} pixels" if match else "over PIL's pixel limit"


def _header_size(fp: BinaryIO) -> tuple[int, int] | None:
    """Width and height read from the header by the matching PIL plugin.

    Image.open refuses to return an image above the limit, so to report its size we run the
    plugins the way Image.open does, minus the limit check. Used only for the error message.
    """
    try:
        Image.init()
        fp.seek(0)
        prefix = fp.read(16)
        for format_id in Image.ID:
            factory, accept = Image.OPEN[format_id]
            # accept() answers truthy for a match, or a str explaining a near miss.
            verdict = accept(prefix) if accept is not None else True
            if not verdict or isinstance(verdict, str):
                continue
            try:
                fp.seek(0)
                return factory(fp, "").size
            except Exception:  # noqa: BLE001 - not this format; try the next plugin
                continue
    except Exception:  # noqa: BLE001 - best effort: the caller falls back to PIL's count
        return None
    return None


def _error(path: Path, problem: str, fix: str) -> ImageReadError:
    return ImageReadError(f"cannot read image {path}: {problem}; {fix}", str(path), problem)


def _directory_error(path: Path) -> ImageReadError:
    return _error(path, "is a directory, not an image file", "pass the image files inside it")


def _one_line(exc: BaseException) -> str:
    """PIL's message squeezed onto one line (some span several), or the exception's type."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
