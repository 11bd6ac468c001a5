"""Image files: which files count as images, how inputs are expanded to them, and the bundled samples.

`expand_image_paths` turns command-line inputs (files and folders) into a list of files plus
one-line errors for the inputs that name nothing usable. `sample_image_dir` is where commands find
real pictures when given none (export's parity check, quantization, the load generator): the
photos shipped in the package's `resources/sample_images/`, or INCEPTIONLAB_SAMPLE_IMAGES.

Standard library only: the load generator (a client that must start without torch) uses it too.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["IMAGE_EXTENSIONS", "SAMPLE_IMAGES_ENV", "expand_image_paths", "sample_image_dir", "sample_image_files"]

IMAGE_EXTENSIONS: tuple[str, ...] = (
    ".jpg",
    ".jpeg",
    ".png",
    ".bmp",
    ".gif",
    ".webp",
    ".tif",
    ".tiff",
    ".ppm",
    ".pgm",
)

# Photos of ImageNet classes shipped with the package (resources/sample_images/PROVENANCE.md), so the
# default does not depend on where the repository or the working directory is.
SAMPLE_IMAGES_ENV = "INCEPTIONLAB_SAMPLE_IMAGES"
BUNDLED_SAMPLE_IMAGES = Path(__file__).resolve().parents[2] / "resources" / "sample_images"


def sample_image_dir() -> Path:
    """INCEPTIONLAB_SAMPLE_IMAGES when set, else the package's own sample photos."""
    return Path(os.environ.get(SAMPLE_IMAGES_ENV) or BUNDLED_SAMPLE_IMAGES)


def sample_image_files() -> list[Path]:
    """The sample pictures, sorted; [] when the folder named by INCEPTIONLAB_SAMPLE_IMAGES is absent."""
    folder = sample_image_dir()
    return expand_image_paths([folder])[0] if folder.is_dir() else []


def expand_image_paths(
    inputs: list[str | Path], recursive: bool = True
) -> tuple[list[Path], list[tuple[str, str]]]:
    """Turn files and directories into a list of image files, in a deterministic order.

    Directories are walked (into subdirectories when `recursive`) for files whose extension is in
    IMAGE_EXTENSIONS, in any case, sorted as Paths (component by component, so each folder's
    files stay together) and appended in the order of `inputs`. Hidden files and directories (dot-names, such as
    macOS `._photo.jpg` resource forks or `.ipynb_checkpoints`) are skipped. Files named
    explicitly are kept whatever their extension: load_rgb will say if they are not images.

    Returns (files, errors); each error is (input as given, one-line message). The message does
    not repeat the input, so a caller can print f"{input}: {message}".
    """
    files: list[Path] = []
    errors: list[tuple[str, str]] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found, listing_errors = _images_in_directory(path, recursive)
            files.extend(found)
            errors.extend((str(item), message) for message in listing_errors)
            if not found and not listing_errors:
                errors.append((str(item), _no_images_message()))
        elif path.exists():
            files.append(path)
        else:
            errors.append((str(item), "no such file or directory"))
    return files, errors


def _images_in_directory(root: Path, recursive: bool) -> tuple[list[Path], list[str]]:
    """Sorted image files under `root`, plus a message for each directory that could not be
    listed (reported rather than skipped, so a permission problem isn't mistaken for no data)."""
    found: list[Path] = []
    listing_errors: list[str] = []
    # Symlinked folders are followed (datasets are often assembled from links, and torchvision's
    # ImageFolder follows them too); remembering real paths stops symlink loops.
    visited: set[str] = set()

    def report(exc: OSError) -> None:
        listing_errors.append(f"cannot list directory {exc.filename}: {exc.strerror or exc}")

    for directory, subdirs, names in os.walk(root, onerror=report, followlinks=True):
        real = os.path.realpath(directory)
        if real in visited:
            subdirs[:] = []
            continue
        visited.add(real)
        subdirs[:] = [d for d in subdirs if not d.startswith(".")] if recursive else []
        found.extend(Path(directory, n) for n in names if _looks_like_image(n))
    return sorted(found), sorted(listing_errors)


def _looks_like_image(name: str) -> bool:
    return not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS)


def _no_images_message() -> str:
    return f"directory has no images (looked for {', '.join(IMAGE_EXTENSIONS)})"
