"""Image files: which files count as images, how inputs are expanded to them, and the bundled samples.

One rule for what counts, used by training's class folders (`list_class_folders`: train, evaluate,
the decoded cache) and by `predict` (`expand_image_paths`):
- a file counts as an image by its extension (IMAGE_EXTENSIONS, any case); a file that then cannot
  be decoded is skipped and named with its reason where it is read (decode.py);
- dot-names count for nothing, files and folders alike: macOS `._photo.jpg` partner files and
  `.DS_Store`, Jupyter's `.ipynb_checkpoints/`, `.thumbnails/`, our own `.inceptionlab-cache/`;
- folder links are followed (datasets are often assembled from links; torchvision's ImageFolder
  follows them too), each real folder once, so a link loop ends; a file link whose target is gone
  is listed like any file and reported as a broken link when read;
- class names are folder names in Unicode NFC: macOS writes `café` decomposed (NFD), Linux and
  Windows tools composed, and both must name one class.

`expand_image_paths` turns command-line inputs (files and folders) into a list of files plus
one-line errors for the inputs that name nothing usable. `sample_image_dir` is where commands find
real pictures when given none (export's parity check, quantization, the load generator): the
photos shipped in the package's `resources/sample_images/`, or INCEPTIONLAB_SAMPLE_IMAGES.

Standard library only: the load generator (a client that must start without torch) uses it too.
"""

from __future__ import annotations

import os
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from inceptionlab.errors import UserError

__all__ = ["IMAGE_EXTENSIONS", "SAMPLE_IMAGES_ENV", "ClassFolders", "class_name", "counts_as_image", "expand_image_paths",
           "images_under", "is_hidden", "left_out_notes", "list_class_folders", "non_images_under", "sample_image_dir",
           "sample_image_files"]

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
    # Phones and browsers: HEIC/HEIF is an iPhone's default (read with pillow-heif, the `heif` extra;
    # refused naming it without), AVIF is read by Pillow >= 11.3, .jfif is a JPEG as browsers save it.
    ".heic",
    ".heif",
    ".avif",
    ".jfif",
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


def is_hidden(name: str) -> bool:
    """A dot-name: never an image or a class, whatever its extension."""
    return name.startswith(".")


def counts_as_image(name: str) -> bool:
    """The rule for a file found in a folder: a visible name with an image extension."""
    return not is_hidden(name) and name.lower().endswith(IMAGE_EXTENSIONS)


def class_name(folder_name: str) -> str:
    """A class folder's name as a class name: Unicode NFC, so both spellings of `café` are one class."""
    return unicodedata.normalize("NFC", folder_name)


# Files that ship beside the images of well-known datasets, not worth a note (tiny-imagenet's box lists).
QUIET_FILES = ("_boxes.txt",)


@dataclass
class ClassFolders:
    """A split folder read by the rule: `<root>/<class>/**/<image>`."""

    root: Path
    classes: list[str] = field(default_factory=list)  # NFC names, sorted; index = label
    samples: list[tuple[str, int]] = field(default_factory=list)  # (path, label), each class's files sorted
    ignored: list[str] = field(default_factory=list)  # visible files without an image extension
    loose: list[str] = field(default_factory=list)  # images directly in root, in no class folder


def left_out_notes(root: Path, ignored: list[str], loose: list[str]) -> list[str]:
    """What a reader of the class folders under `root` says it did not read: visible files without an
    image extension, and images directly in `root`, in no class folder."""
    notes = []
    if ignored:
        notes.append(f"ignored {len(ignored)} non-image file(s), e.g. {ignored[0]}")
    if loose:
        notes.append(f"ignored {len(loose)} image(s) directly in {root}/, not in a class folder, "
                     f"e.g. {Path(loose[0]).name}: move them into {root}/<class>/ to use them")
    return notes


def images_under(folder: Path) -> list[Path]:
    """Image files under `folder` (any depth) by the rule above, sorted; folders that cannot be listed
    are skipped (`list_class_folders` refuses them instead)."""
    return _files_in_directory(Path(folder), recursive=True)[0]


def non_images_under(folder: Path) -> list[str]:
    """Visible files under `folder` (any depth) that the rule does not read as images, sorted: what a
    reader of the folder says it ignored (`left_out_notes`)."""
    return [str(path) for path in _files_in_directory(Path(folder), recursive=True)[1]
            if not path.name.endswith(QUIET_FILES)]


def list_class_folders(root: Path, strict: bool = True) -> ClassFolders:
    """Every class folder of `root` and its images, by the rule above.

    Raises UserError for a missing root, no class folders, a class folder without images, two
    folders that name one class, or a folder that cannot be listed (data would silently be missing).
    `strict=False` (a data check, which reports such folders itself): empty class folders are kept
    without samples, folders that cannot be listed count as empty, the first of two folders naming
    one class is kept, no class folders is an empty listing; a missing root is still an error.
    """
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root}: dataset folder not found (pass --data DIR with train/ and val/ class folders)")
    folders: dict[str, Path] = {}
    listing = ClassFolders(root)
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if is_hidden(entry.name):
            continue
        if entry.is_dir():  # follows links
            name = class_name(entry.name)
            if name in folders and not strict:
                continue
            if name in folders:
                raise UserError(f"{root}: folders {folders[name].name!r} and {entry.name!r} name one class "
                                f"({name}); merge them")
            folders[name] = Path(entry.path)
        elif counts_as_image(entry.name):
            listing.loose.append(entry.path)
    if not folders and strict:
        where = f"; its {len(listing.loose)} image(s) must sit in class folders" if listing.loose else ""
        raise UserError(f"{root}: no class folders; expected {root}/<class>/<image files>{where}")
    listing.classes = sorted(folders)
    for label, name in enumerate(listing.classes):
        images, others, errors = _files_in_directory(folders[name], recursive=True)
        if errors and strict:
            raise UserError(f"{folders[name]}: {errors[0]}; make it readable or remove it")
        if not images and strict:
            raise UserError(f"{folders[name]}: class folder has no images; add images or remove the folder")
        listing.samples.extend((str(path), label) for path in images)
        listing.ignored.extend(str(path) for path in others if not path.name.endswith(QUIET_FILES))
    return listing


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
    images, _, listing_errors = _files_in_directory(root, recursive)
    return images, listing_errors


def _files_in_directory(root: Path, recursive: bool) -> tuple[list[Path], list[Path], list[str]]:
    """(image files, other visible files, listing errors) under `root`, by the rule, each sorted."""
    found: list[Path] = []
    others: list[Path] = []
    listing_errors: list[str] = []
    # Remembering real paths stops link loops (folder links are followed: the module's rule).
    visited: set[str] = set()

    def report(exc: OSError) -> None:
        listing_errors.append(f"cannot list directory {exc.filename}: {exc.strerror or exc}")

    for directory, subdirs, names in os.walk(root, onerror=report, followlinks=True):
        real = os.path.realpath(directory)
        if real in visited:
            subdirs[:] = []
            continue
        visited.add(real)
        subdirs[:] = [d for d in subdirs if not is_hidden(d)] if recursive else []
        found.extend(Path(directory, n) for n in names if counts_as_image(n))
        others.extend(Path(directory, n) for n in names if not is_hidden(n) and not counts_as_image(n))
    return sorted(found), sorted(others), sorted(listing_errors)


def _no_images_message() -> str:
    return f"directory has no images (looked for {', '.join(IMAGE_EXTENSIONS)})"
