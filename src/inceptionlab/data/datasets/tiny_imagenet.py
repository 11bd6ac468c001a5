"""Tiny ImageNet (200 classes, 64x64): download, unpack, and regroup val into class folders.

The zip unpacks to `tiny-imagenet-200/` with `train/<wnid>/images/*.JPEG` (already one folder per
class) but all validation images in one folder, `val/images/`, with their labels in
`val/val_annotations.txt`. Like the ROCm guide's script, `prepare_tiny_imagenet` moves each
`val/images/<f>` to `val/<wnid>/images/<f>` so that train and val read the same way.

Unlike that script, the regroup
- checks everything first (annotations well-formed, wnids known, no image missing or unlisted)
  and moves nothing if anything is wrong;
- moves one file at a time with `os.replace` (atomic on one filesystem), accepting each image in
  either place, so a run killed at any moment can simply be run again, and a second run is a
  no-op;
- never deletes an image: one found in both places is an error for the user to resolve.

At the end it writes `tiny-imagenet-200/.inceptionlab-prepared.json` (the counts) atomically.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from inceptionlab.data.io.archives import open_zip, safe_extract_zip
from inceptionlab.data.io.download import DownloadError, fetch, show_progress
from inceptionlab.errors import UserError
from inceptionlab.fileio import atomic_write_text

TINY_IMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
TINY_IMAGENET_MD5 = "90528d7ca1a48142e341f4ef8d21d0de"
DATASET_DIRNAME = "tiny-imagenet-200"
ARCHIVE_NAME = "tiny-imagenet-200.zip"
MARKER_NAME = ".inceptionlab-prepared.json"
ANNOTATIONS = "val/val_annotations.txt"
ANNOTATION_FIELDS = 6  # file, wnid, x0, y0, x1, y1
MARKER_FORMAT = 1


# --- report ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitCounts:
    images: int
    per_class_min: int | None = None  # None for the unlabelled test split
    per_class_max: int | None = None


@dataclass
class PrepareReport:
    dataset: Path
    classes: int
    train: SplitCounts
    val: SplitCounts
    test: SplitCounts
    # What this run did; the counts above are what any later run must report again.
    downloaded: bool = False
    extracted: int = 0
    moved: int = 0

    def counts(self) -> dict:
        return {
            "classes": self.classes,
            "train": asdict(self.train),
            "val": asdict(self.val),
            "test": {"images": self.test.images},
        }

    def to_dict(self) -> dict:
        return {
            "dataset": str(self.dataset),
            **self.counts(),
            "actions": {"downloaded": self.downloaded, "extracted": self.extracted, "moved": self.moved},
        }


@dataclass
class Problems:
    """Collects every validation problem so the error can say how many there are, not just one."""

    messages: list[str] = field(default_factory=list)

    def add(self, message: str) -> None:
        self.messages.append(message)

    def raise_if_any(self) -> None:
        if not self.messages:
            return
        more = len(self.messages) - 1
        plural = "s" if more > 1 else ""
        suffix = f" (and {more} more problem{plural}; nothing was moved)" if more else " (nothing was moved)"
        raise UserError(self.messages[0] + suffix)


# --- locating and reading metadata -------------------------------------------------------------


def find_dataset_dir(root: str | os.PathLike) -> Path:
    """`root` itself if it holds wnids.txt (the dataset folder), else `root/tiny-imagenet-200`."""
    root = Path(root)
    return root if (root / "wnids.txt").is_file() else root / DATASET_DIRNAME


def read_wnids(dataset: Path) -> list[str]:
    path = dataset / "wnids.txt"
    if not path.is_file():
        raise UserError(f"{path} not found; pass --root the folder that contains {DATASET_DIRNAME}/")
    wnids = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not wnids:
        raise UserError(f"{path} is empty; extract the archive again")
    seen: set[str] = set()
    for number, wnid in enumerate(wnids, 1):
        if wnid in seen:
            raise UserError(f"{path}: {wnid} is listed twice (entry {number}); delete the duplicate")
        seen.add(wnid)
    return wnids


def first_synonym(words: str) -> str:
    return words.split(",")[0].strip()


def read_class_names(root: str | os.PathLike, *, full: bool = False) -> dict[str, str]:
    """wnid -> human name for the dataset's classes, in wnids.txt order, from words.txt.

    words.txt holds comma-separated synonyms ("goldfish, Carassius auratus"). The default is the
    first synonym ("goldfish"): short enough for plot labels and predictions, and unique across
    the 200 classes. `full=True` returns the whole words string.
    """
    dataset = find_dataset_dir(root)
    wnids = read_wnids(dataset)
    path = dataset / "words.txt"
    if not path.is_file():
        raise UserError(f"{path} not found; extract the archive again")
    wanted = set(wnids)
    found: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            wnid, _, words = line.rstrip("\r\n").partition("\t")
            if wnid in wanted:
                found[wnid] = words.strip() if full else (first_synonym(words) or wnid)
    missing = [w for w in wnids if w not in found]
    if missing:
        raise UserError(f"{path} has no line for {missing[0]} (listed in wnids.txt); extract the archive again")
    return {w: found[w] for w in wnids}


# --- validation --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ValEntry:
    line: int
    filename: str
    wnid: str


def read_val_annotations(dataset: Path, known_wnids: set[str]) -> list[ValEntry]:
    """Parse val_annotations.txt; every problem names the file and line number."""
    path = dataset / ANNOTATIONS
    if not path.is_file():
        raise UserError(f"{path} not found; extract the archive again")
    problems = Problems()
    entries: list[ValEntry] = []
    first_line: dict[str, int] = {}
    with open(path, encoding="utf-8", newline="") as f:
        for number, raw in enumerate(f, 1):
            line = raw.rstrip("\r\n")  # some copies of the file have CRLF endings
            if not line.strip():
                continue
            problem = annotation_problem(line, known_wnids)
            if problem:
                problems.add(f"{path}:{number}: {problem}")
                continue
            filename, wnid = line.split("\t")[:2]
            if filename in first_line:
                problems.add(f"{path}:{number}: {filename} is already listed on line "
                             f"{first_line[filename]}; delete one line")
                continue
            first_line[filename] = number
            entries.append(ValEntry(number, filename, wnid))
    problems.raise_if_any()
    if not entries:
        raise UserError(f"{path} lists no images; extract the archive again")
    return entries


def annotation_problem(line: str, known_wnids: set[str]) -> str | None:
    fields = line.split("\t")
    if len(fields) != ANNOTATION_FIELDS:
        return (f"expected {ANNOTATION_FIELDS} tab-separated fields (file, wnid, x0, y0, x1, y1), "
                f"got {len(fields)}; fix or delete that line")
    filename, wnid, *box = fields
    if not is_plain_filename(filename):
        return f"{filename!r} is not a plain file name; fix or delete that line"
    if not all(re.fullmatch(r"-?\d+", value.strip()) for value in box):
        return f"box {box} is not four integers; fix or delete that line"
    if wnid not in known_wnids:
        return f"wnid {wnid!r} is not in wnids.txt; fix that line or add {wnid} to wnids.txt"
    return None


def is_plain_filename(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name


def list_names(directory: Path) -> set[str]:
    """Entry names in `directory` (empty if it does not exist): one listing instead of a stat per file."""
    try:
        return set(os.listdir(directory))
    except FileNotFoundError:
        return set()


def visible(names: set[str]) -> set[str]:
    # Hidden names are temporaries (an interrupted extraction) or OS litter, never images.
    return {n for n in names if not n.startswith(".")}


def class_dirs_in_val(dataset: Path) -> list[str]:
    val = dataset / "val"
    return sorted(n for n in list_names(val) if n != "images" and (val / n).is_dir())


def plan_val_regroup(dataset: Path, entries: list[ValEntry], known_wnids: set[str]) -> list[ValEntry]:
    """The entries still in val/images, after checking that the whole val split is consistent.

    Each listed image must be in exactly one of val/images/<f> and val/<wnid>/images/<f>, and
    every file in those folders must be listed (for that wnid). Raises before anything is moved.
    """
    val = dataset / "val"
    annotations = dataset / ANNOTATIONS
    problems = Problems()
    pending_names = list_names(val / "images")
    listed = {e.filename for e in entries}
    grouped: dict[str, set[str]] = {}
    for name in class_dirs_in_val(dataset):
        if name not in known_wnids:
            problems.add(f"{val / name} is not a class in wnids.txt; move it out of {val}")
            continue
        grouped[name] = list_names(val / name / "images")
    pending: list[ValEntry] = []
    for e in entries:
        src, dst = val / "images" / e.filename, val / e.wnid / "images" / e.filename
        in_src, in_dst = e.filename in pending_names, e.filename in grouped.get(e.wnid, ())
        if in_src and in_dst:
            problems.add(f"{src} and {dst} both exist; keep one of them (compare them first) and run again")
        elif in_src:
            pending.append(e)
        elif not in_dst:
            problems.add(f"{annotations}:{e.line}: {e.filename} is listed but is neither at {src} nor at {dst}; "
                         "extract the archive again to restore it")
    for name in sorted(pending_names - listed):
        problems.add(f"{val / 'images' / name} is not listed in {annotations}; remove it or add a line for it")
    wnid_of = {e.filename: e.wnid for e in entries}
    for wnid, names in grouped.items():
        for name in sorted(visible(names)):
            if wnid_of.get(name) != wnid:
                problems.add(f"{val / wnid / 'images' / name} is not listed for {wnid} in {annotations}; "
                             "move it out of the val folder")
    problems.raise_if_any()
    return pending


def check_train_layout(dataset: Path, wnids: list[str]) -> None:
    """One train/<wnid>/images folder per class in wnids.txt, and no others (ImageFolder would count them)."""
    train = dataset / "train"
    problems = Problems()
    for wnid in wnids:
        if not (train / wnid / "images").is_dir():
            problems.add(f"{train / wnid / 'images'} not found; extract the archive again")
    for name in sorted(visible(list_names(train)) - set(wnids)):
        problems.add(f"{train / name} is not a class in wnids.txt; move it out of {train}")
    problems.raise_if_any()


# --- regroup -----------------------------------------------------------------------------------


def regroup_val(dataset: Path, pending: list[ValEntry], progress: bool) -> int:
    """Move each pending image into its class folder, one atomic rename at a time."""
    val = dataset / "val"
    made: set[str] = set()
    moved = 0
    for e in tqdm(pending, desc="regroup val", unit="img", disable=not show_progress(progress)):
        if e.wnid not in made:
            (val / e.wnid / "images").mkdir(parents=True, exist_ok=True)
            made.add(e.wnid)
        os.replace(val / "images" / e.filename, val / e.wnid / "images" / e.filename)
        moved += 1
    return moved


def remove_empty_images_dir(dataset: Path) -> None:
    images = dataset / "val" / "images"
    if not images.is_dir():
        return
    try:
        images.rmdir()  # only succeeds when empty: never removes an image
    except OSError as exc:
        raise UserError(
            f"{images} is not empty after the regroup ({exc}); move its files out and run again"
        ) from exc


# --- counting ----------------------------------------------------------------------------------


def count_images(directory: Path) -> int:
    return len(visible(list_names(directory)))


def per_class_counts(split: Path, wnids: list[str]) -> SplitCounts:
    counts = [count_images(split / wnid / "images") for wnid in wnids]
    return SplitCounts(images=sum(counts), per_class_min=min(counts), per_class_max=max(counts))


def count_dataset(dataset: Path, wnids: list[str]) -> PrepareReport:
    return PrepareReport(
        dataset=dataset,
        classes=len(wnids),
        train=per_class_counts(dataset / "train", wnids),
        val=per_class_counts(dataset / "val", wnids),
        test=SplitCounts(images=count_images(dataset / "test" / "images")),
    )


def write_marker(dataset: Path, report: PrepareReport) -> None:
    """Record the counts atomically; an identical marker is left untouched so a re-run writes nothing."""
    marker = dataset / MARKER_NAME
    text = json.dumps({"format": MARKER_FORMAT, **report.counts()}, indent=2, sort_keys=True) + "\n"
    if marker.is_file() and marker.read_text(encoding="utf-8") == text:
        return
    atomic_write_text(marker, text)


def read_marker(root: str | os.PathLike) -> dict | None:
    """The counts recorded by the last complete prepare, or None if it never completed."""
    marker = find_dataset_dir(root) / MARKER_NAME
    try:
        return json.loads(marker.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


# --- obtaining the files -----------------------------------------------------------------------


def extraction_dir(root: Path) -> Path:
    """The folder the zip's top-level `tiny-imagenet-200/` goes into."""
    if not (root / "wnids.txt").is_file():
        return root
    if root.name != DATASET_DIRNAME:
        raise UserError(f"{root} holds a dataset but is not named {DATASET_DIRNAME}; "
                        "pass --root its parent folder, or leave out --archive")
    return root.parent


def check_archive_layout(archive: Path) -> None:
    with open_zip(archive) as zf:
        names = set(zf.namelist())
    if f"{DATASET_DIRNAME}/wnids.txt" not in names:
        raise UserError(f"{archive} has no {DATASET_DIRNAME}/wnids.txt; it is not the Tiny ImageNet zip "
                        f"(expected one top folder {DATASET_DIRNAME}/)")


def extract_archive(archive: Path, root: Path, progress: bool) -> int:
    """Extract, leaving out val images a previous run already moved into their class folder."""
    target = extraction_dir(root)
    check_archive_layout(archive)
    val = target / DATASET_DIRNAME / "val"
    regrouped = set()
    for wnid in class_dirs_in_val(target / DATASET_DIRNAME):
        regrouped |= list_names(val / wnid / "images")
    prefix = f"{DATASET_DIRNAME}/val/images/"

    def already_regrouped(member: str) -> bool:
        return member.startswith(prefix) and member[len(prefix):] in regrouped

    return safe_extract_zip(archive, target, skip=already_regrouped, progress=progress).extracted


def download_archive(root: Path, url: str, md5: str | None, progress: bool) -> Path:
    dest = root / ARCHIVE_NAME
    try:
        return fetch(url, dest, md5=md5, progress=progress)
    except DownloadError as exc:
        raise UserError(
            f"could not download {url} ({exc.reason}); download it on a machine with network access "
            f"and put it at {dest} (or anywhere, and pass --archive PATH)"
        ) from exc


def obtain_dataset(
    root: Path, archive: Path | None, url: str, md5: str | None, progress: bool
) -> tuple[bool, int]:
    """Make sure the files are unpacked under `root`; returns (downloaded, files extracted)."""
    if archive is not None:
        return False, extract_archive(archive, root, progress)
    dataset = find_dataset_dir(root)
    if not (dataset / "wnids.txt").is_file():
        root.mkdir(parents=True, exist_ok=True)
        downloaded = not (root / ARCHIVE_NAME).is_file()
        zip_path = download_archive(root, url, md5, progress)
        return downloaded, extract_archive(zip_path, root, progress)
    default_zip = dataset.parent / ARCHIVE_NAME
    if not (dataset / MARKER_NAME).is_file() and dataset.name == DATASET_DIRNAME and default_zip.is_file():
        # An earlier run was cut off while extracting the zip it downloaded: finish the job.
        return False, extract_archive(default_zip, dataset.parent, progress)
    return False, 0


# --- entry point -------------------------------------------------------------------------------


def prepare_tiny_imagenet(
    root: str | os.PathLike,
    archive: str | os.PathLike | None = None,
    url: str = TINY_IMAGENET_URL,
    progress: bool = True,
    *,
    md5: str | None = TINY_IMAGENET_MD5,
) -> PrepareReport:
    """Download (unless `archive` or the files are there), extract, validate, regroup val, count.

    `root` is the folder that contains (or will contain) `tiny-imagenet-200/`, or that folder
    itself. Safe to run again at any time: a finished dataset is only re-checked and re-counted.
    """
    root = Path(root).expanduser()
    archive = Path(archive).expanduser() if archive else None
    downloaded, extracted = obtain_dataset(root, archive, url, md5, progress)
    dataset = find_dataset_dir(root)
    wnids = read_wnids(dataset)
    known = set(wnids)
    read_class_names(dataset)  # fails now, not at training time, if words.txt lacks a class
    check_train_layout(dataset, wnids)
    entries = read_val_annotations(dataset, known)
    pending = plan_val_regroup(dataset, entries, known)
    moved = regroup_val(dataset, pending, progress)
    remove_empty_images_dir(dataset)
    report = count_dataset(dataset, wnids)
    report.downloaded, report.extracted, report.moved = downloaded, extracted, moved
    write_marker(dataset, report)
    return report
