"""Labelled image files from a list instead of split folders: a labels CSV, or one folder of classes.

Two layouts the imagefolder reader takes besides `train/` + `val/`:
- a CSV of `file,label` (a header row naming the columns; an optional `split` column), files relative
  to the CSV's folder unless absolute (`data.labels_csv`);
- one folder of class folders without `val/` (`data.root` holds `<class>/<images>`).

Without a split column the files are split once, seeded and stratified: each class gives
`round(n_c x val_fraction)` of its files (at least one when it has two or more) to validation, drawn
with `data.split_seed`. The assignment is written to the run directory as `splits.csv`
(file,label,split), and every later command that reads the run's data (evaluate, resume, export's
parity images) reads that file (`data.split_file`), so all of them score the same images even if the
folder gains files later.
"""

from __future__ import annotations

import csv
import io
import random
import unicodedata
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inceptionlab.data.io.image_files import list_class_folders
from inceptionlab.errors import UserError
from inceptionlab.fileio import atomic_write_text

SPLITS_FILE = "splits.csv"  # in the run directory: the split every command of the run scores
FILE_COLUMNS = ("file", "path", "filename", "image")
LABEL_COLUMNS = ("label", "class", "category")
DEFAULT_VAL_FRACTION = 0.2


@dataclass
class ClassFolder:
    """A folder of class folders read by the rule training reads them by."""

    root: Path
    classes: list[str]  # NFC names, sorted; index = label
    samples: list[tuple[str, int]]  # (file, label), each class's files sorted
    loose: list[str]  # images directly in root, in no class folder
    ignored: list[str]  # visible files without an image extension (notes, raw files): not read


def list_class_folder(root: Path) -> ClassFolder:
    """`<root>/<class>/**/<image>` by the rule of data/io/image_files.py (`list_class_folders`, the one
    training reads folders by): dot-names count for nothing, folder links are followed (each real folder
    once), class names are Unicode NFC, an image is a visible file with an image extension. Empty class
    folders are kept (with no samples): a check reports them, a reader refuses them."""
    listing = list_class_folders(Path(root), strict=False)
    return ClassFolder(listing.root, listing.classes, listing.samples, listing.loose, listing.ignored)


@dataclass(frozen=True)
class LabelRow:
    file: Path
    label: str
    split: str | None = None


def _column(header: list[str], names: tuple[str, ...]) -> int | None:
    lowered = [h.strip().lower() for h in header]
    return next((lowered.index(n) for n in names if n in lowered), None)


def read_labels_csv(path: Path, base: Path | None = None) -> list[LabelRow]:
    """Rows of a labels CSV (or a recorded splits.csv), files resolved against `base` (default: the
    CSV's folder); one-line errors naming the line, and for files that do not exist."""
    path = Path(path)
    base = path.parent if base is None else Path(base)
    rows, seen = _listed_rows(path, base)
    missing = [(seen[str(r.file)], r.file) for r in rows if not r.file.is_file()]
    if missing:
        line, file = missing[0]
        raise UserError(f"{path}: {len(missing)} listed file(s) do not exist, e.g. line {line}: {file}; fix the "
                        f"paths (relative to {base}) or remove the rows")
    return rows


def recorded_files_found(path: Path, root: Path) -> tuple[int, int]:
    """How many of a recorded splits.csv's files lie under `root`, of how many: all of them when `root`
    holds the run's own data (moved there), none when it holds other images."""
    rows, _ = _listed_rows(Path(path), Path(root))
    return sum(row.file.is_file() for row in rows), len(rows)


def _listed_rows(path: Path, base: Path) -> tuple[list[LabelRow], dict[str, int]]:
    """The rows as listed (files resolved against `base`, not checked), and each file's line number."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # Excel writes a byte-order mark
    except FileNotFoundError:
        raise UserError(f"{path}: labels CSV not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read the labels CSV ({exc})") from None
    lines = list(csv.reader(io.StringIO(text)))
    if not lines:
        raise UserError(f"{path}: empty labels CSV; write a header `file,label` and one row per image")
    header = lines[0]
    file_col, label_col = _column(header, FILE_COLUMNS), _column(header, LABEL_COLUMNS)
    split_col = _column(header, ("split",))
    if file_col is None or label_col is None:
        raise UserError(f"{path}: the first row must name the columns, e.g. `file,label` (or with a `split` "
                        f"column); found {', '.join(header) or 'nothing'}")
    rows, seen = [], {}
    for number, line in enumerate(lines[1:], start=2):
        if not any(cell.strip() for cell in line):
            continue
        if len(line) <= max(file_col, label_col, split_col or 0):
            raise UserError(f"{path}:{number}: {len(line)} column(s), expected {len(header)}")
        name, label = line[file_col].strip(), unicodedata.normalize("NFC", line[label_col].strip())
        if not name or not label:
            raise UserError(f"{path}:{number}: empty {'file' if not name else 'label'}")
        file = Path(name) if Path(name).is_absolute() else base / name
        if str(file) in seen:
            raise UserError(f"{path}:{number}: {name} is listed twice (also line {seen[str(file)]}); keep one row per file")
        seen[str(file)] = number
        split = line[split_col].strip() if split_col is not None and line[split_col].strip() else None
        rows.append(LabelRow(file, label, split))
    if not rows:
        raise UserError(f"{path}: no rows under the header")
    return rows, seen


def read_splits_file(path: Path, root: Path) -> list[LabelRow]:
    """A run's recorded splits.csv; its relative files lie under the data root."""
    rows = read_labels_csv(path, base=root)
    if any(r.split is None for r in rows):
        raise UserError(f"{path}: every row needs a split (train or val): it is a run's record, not a labels CSV")
    return rows


def stratified_split(rows: list[LabelRow], val_fraction: float, seed: int) -> list[LabelRow]:
    """The rows with `split` set to train or val: per class, round(n x val_fraction) files (at least one
    of a class with two or more) go to val, drawn by `seed`; the rest to train. The order of `rows`
    does not matter: each class's files are sorted before the draw."""
    if not 0 < val_fraction < 1:
        raise UserError(f"data.val_fraction={val_fraction}: give a share of each class in (0, 1), e.g. 0.2")
    by_class: dict[str, list[LabelRow]] = defaultdict(list)
    for row in rows:
        by_class[row.label].append(row)
    rng = random.Random(seed)
    out = []
    for label in sorted(by_class):
        members = sorted(by_class[label], key=lambda r: str(r.file))
        n_val = round(len(members) * val_fraction)
        n_val = min(max(n_val, 1 if len(members) >= 2 else 0), len(members) - 1)
        chosen = set(rng.sample(range(len(members)), n_val))
        out += [LabelRow(r.file, r.label, "val" if i in chosen else "train") for i, r in enumerate(members)]
    return out


def rows_of(folder: ClassFolder) -> list[LabelRow]:
    """A class folder's files as label rows; a class folder without images is an error (as for split folders)."""
    counts = {name: 0 for name in folder.classes}
    for _, label in folder.samples:
        counts[folder.classes[label]] += 1
    empty = [name for name, n in counts.items() if n == 0]
    if empty:
        raise UserError(f"{folder.root / empty[0]}: class folder has no images; add images or remove the folder")
    return [LabelRow(Path(path), folder.classes[label]) for path, label in folder.samples]


def recorded_split(run_dir: Path) -> list[str]:
    """--set overrides that make a command read a run's data as its training did: its splits.csv."""
    path = Path(run_dir) / SPLITS_FILE
    return [f"data.split_file={path}"] if path.is_file() else []


def splits_text(rows: list[LabelRow], root: Path) -> str:
    """splits.csv: file (relative to `root` where it lies under it), label, split."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["file", "label", "split"])
    for row in rows:
        try:
            name = str(row.file.relative_to(root))
        except ValueError:
            name = str(row.file)
        writer.writerow([name, row.label, row.split])
    return buffer.getvalue()


def splits_writer(rows: list[LabelRow], root: Path) -> Any:
    """A SplitPair artifact: `save(path)` writes splits.csv with files relative to the data root."""
    text = splits_text(rows, root)
    return lambda path: atomic_write_text(Path(path), text)


