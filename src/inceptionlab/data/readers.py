"""Dataset readers by name: a recipe's `data.reader` picks one; the engine never asks which.

An image reader says where its ImageFolder root is (preparing it first if it can) and, optionally,
what the human labels of its folder names are. Splits are `<root>/<split>/<class>/...`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from inceptionlab.config import AugmentConfig, DataConfig
from inceptionlab.data.check import quick_check, warning_line
from inceptionlab.data.datasets.cifar10 import load_cifar10
from inceptionlab.data.datasets.digits import ensure_digits_imagefolder
from inceptionlab.data.datasets.file_list import (
    DEFAULT_VAL_FRACTION,
    SPLITS_FILE,
    LabelRow,
    list_class_folder,
    read_labels_csv,
    read_splits_file,
    rows_of,
    stratified_split,
)
from inceptionlab.data.datasets.imdb import CLASS_NAMES, download_imdb, load_imdb
from inceptionlab.data.datasets.mnist import load_idx_split
from inceptionlab.data.datasets.tiny_imagenet import read_class_names
from inceptionlab.data.io.image_files import left_out_notes
from inceptionlab.data.splits import ArraySplit
from inceptionlab.data.splits import SplitPair
from inceptionlab.data.text.child_reader import read_standardized_in_worker
from inceptionlab.data.text.standardize import StandardizedTexts
from inceptionlab.data.text.vectorizer import TextVectorizer
from inceptionlab.errors import UserError
from inceptionlab.models.spec import eval_transform


def _data_root(cfg: DataConfig) -> Path:
    if not cfg.root and cfg.labels_csv:
        return Path(cfg.labels_csv).expanduser().parent  # the CSV's files are relative to its folder
    if not cfg.root:
        raise UserError("no dataset folder: pass --data DIR (or set data.root in the recipe)")
    return Path(cfg.root).expanduser()


def _folder_root(cfg: DataConfig) -> Path:
    """The image folder's root; a file given as --data is refused naming it (not as `FILE/train` missing)."""
    root = _data_root(cfg)
    if root.exists() and not root.is_dir() and not cfg.labels_csv:
        raise UserError(f"{root}: not a folder; pass --data DIR, a folder of class folders (or with train/ and val/ "
                        "class folders)")
    return root


def _file_rows(cfg: DataConfig, root: Path) -> tuple[list[LabelRow], list[str]] | None:
    """The split as label rows when the data is not train/ + val/ class folders (file_list.py): a run's
    recorded split, a labels CSV, or one folder of class folders (train/ alone, or the root itself);
    None for split folders. The second item: notes on how the split was made and what was left out."""
    if cfg.split_file:
        return read_splits_file(Path(cfg.split_file), root), []
    notes: list[str] = []
    if cfg.labels_csv:
        rows, where = read_labels_csv(Path(cfg.labels_csv).expanduser()), f"{cfg.labels_csv}"
    elif (root / cfg.val_split).is_dir():
        return None
    elif root.is_dir():
        folder = list_class_folder(root / cfg.train_split if (root / cfg.train_split).is_dir() else root)
        rows, notes = rows_of(folder), left_out_notes(folder.root, folder.ignored, folder.loose)
        where = (f"{folder.root} (no {cfg.val_split}/)" if folder.root != root
                 else f"{root} (no {cfg.train_split}/ or {cfg.val_split}/)")
    else:
        return None  # a missing folder: the class-folder reader says so
    if all(row.split for row in rows):  # the labels CSV's own split column
        return rows, [*notes, *_unvalidated_classes(rows)]
    fraction = cfg.val_fraction or DEFAULT_VAL_FRACTION
    note = (f"split {where} per class: {fraction:.0%} validation, seed {cfg.split_seed}; recorded in the run's "
            f"{SPLITS_FILE}")
    split = stratified_split(rows, fraction, cfg.split_seed)
    if not any(row.split == "val" for row in split):
        raise UserError(f"{where}: no image left for validation: each class gives {fraction:.0%} of its images to "
                        "it, and a class needs at least 2 images to give one (every class here has 1); add images")
    return split, [note, *_unvalidated_classes(split), *notes]


def _unvalidated_classes(split: list[LabelRow]) -> list[str]:
    """A note per class the split left without a validation image (a class of one image: it trains)."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for row in split:
        counts[row.label][row.split] += 1
    return [f"no validation image of {label} ({n['train']} image{'s' if n['train'] != 1 else ''} in all, which "
            f"train{'s' if n['train'] == 1 else ''}): its accuracy is not measured; add images of it"
            for label, n in sorted(counts.items()) if not n["val"]]


def _tiny_imagenet_root(cfg: DataConfig) -> Path:
    root = _data_root(cfg)
    if (root / "tiny-imagenet-200").is_dir() and not (root / "wnids.txt").exists():
        root = root / "tiny-imagenet-200"
    if (root / cfg.val_split / "images").is_dir():
        raise UserError(
            f"{root / cfg.val_split}: validation images are not grouped by class yet; "
            f"run `inceptionlab data tiny-imagenet --root {root}` first"
        )
    return root


def _tiny_imagenet_labels(root: Path, class_names: list[str]) -> list[str]:
    names = read_class_names(root)
    return [names.get(wnid, wnid) for wnid in class_names]


def _digits_root(cfg: DataConfig) -> Path:
    return ensure_digits_imagefolder(_data_root(cfg))


@dataclass(frozen=True)
class ImageReader:
    root: Callable[[DataConfig], Path]
    labels: Callable[[Path, list[str]], list[str]] | None = None
    # The reader writes its data set into data.root (the embedded demo's digits): a folder of the user's
    # own photos given to `evaluate --data` is read as class folders instead, never taken for a place to
    # generate into.
    makes_its_data: bool = False


READERS: dict[str, ImageReader] = {
    "imagefolder": ImageReader(_folder_root),
    "tiny_imagenet": ImageReader(_tiny_imagenet_root, _tiny_imagenet_labels),
    "digits": ImageReader(_digits_root, makes_its_data=True),
}


def _reader(cfg: DataConfig) -> ImageReader:
    try:
        return READERS[cfg.reader]
    except KeyError:
        known = ", ".join([*READERS, *ARRAY_READERS])
        raise UserError(f"data.reader={cfg.reader!r} is not one of {known}") from None


def read_splits(cfg: DataConfig, augment: AugmentConfig | None = None) -> SplitPair:
    """Train and val datasets that agree on their classes (plus a test split when the data has one);
    `augment` adds the recipe's policy and erasing to an image folder's training transform."""
    if cfg.reader in ARRAY_READERS:
        return ARRAY_READERS[cfg.reader](cfg)
    # Image folders decode files per sample through torchvision transforms (imported only here).
    from inceptionlab.data.datasets.imagefolder import image_folder_splits, labelled_file_splits
    from inceptionlab.data.transforms.host import train_transform  # torchvision (~1.3 s): image folders only

    train_tf = train_transform(cfg, augment)
    val_tf = eval_transform(cfg.val_resize_size, cfg.val_crop_size, cfg.interpolation)
    reader = _reader(cfg)
    root = reader.root(cfg)
    # JPEGs decoded at a reduced scale as the decoded cache (training) and `evaluate` (validation) read them:
    # every data path then validates on the pixels `evaluate`, `predict` and `serve` see.
    max_sides = (cfg.cache_size, cfg.val_resize_size)
    listed = _file_rows(cfg, root)
    if listed is not None:
        splits = labelled_file_splits(listed[0], root, train_tf, val_tf, listed[1], max_sides=max_sides)
    else:
        splits = image_folder_splits(root, cfg.train_split, cfg.val_split, train_tf, val_tf, max_sides=max_sides)
    if reader.labels is not None:
        splits.class_labels = reader.labels(root, splits.class_names)
    return splits


# `--split all`: every image under an image dataset's root class folders, split or not (a folder of new photos).
WHOLE_FOLDER = "all"


def read_eval_split(cfg: DataConfig, transform: Any, split: str | None = None) -> Any:
    """One split for evaluation: default the validation split; `test` for a dataset's test split;
    WHOLE_FOLDER for every image in the class folders of an image dataset's root."""
    if cfg.reader in ONE_SPLIT_READERS:
        dataset = ONE_SPLIT_READERS[cfg.reader](cfg, split or "val")
        if dataset is not None:
            return dataset
    if cfg.reader in ARRAY_READERS:
        pair = ARRAY_READERS[cfg.reader](cfg)
        chosen = {"train": pair.train, "val": pair.val, "test": pair.test or pair.val}
        if (split or "val") not in chosen:
            raise UserError(f"--split {split!r}: {cfg.reader} has the splits train, val, test")
        return chosen[split or "val"]
    from inceptionlab.data.datasets.imagefolder import RobustImageFolder  # torchvision (~1.3 s): image folders only

    root = _reader(cfg).root(cfg)
    if split == WHOLE_FOLDER:
        return RobustImageFolder(root, transform=transform, max_side=cfg.val_resize_size)
    listed = _file_rows(cfg, root)
    if listed is not None:
        return _listed_split(listed[0], root, transform, split or "val", cfg.val_resize_size)
    return RobustImageFolder(root / (split or cfg.val_split), transform=transform, max_side=cfg.val_resize_size)


def _listed_split(rows: list[LabelRow], root: Path, transform: Any, split: str, max_side: int | None) -> Any:
    from inceptionlab.data.datasets.imagefolder import LabelledFiles  # torchvision (~1.3 s): image folders only

    chosen = [row for row in rows if row.split == split]
    if not chosen:
        raise UserError(f"--split {split!r}: the data's split has {', '.join(sorted({r.split for r in rows}))}")
    return LabelledFiles(chosen, sorted({row.label for row in rows}), root / split, transform, max_side)


# --- In-memory datasets: the original files are read into tensors once. ---------------------------


def _carve_validation(train: ArraySplit, cfg: DataConfig) -> tuple[ArraySplit, ArraySplit]:
    """Split `cfg.val_fraction` of train off as validation, with a fixed seed (the guide's 80:20, seed 42)."""
    generator = torch.Generator().manual_seed(cfg.split_seed)
    order = torch.randperm(len(train), generator=generator)
    n_val = int(round(len(train) * (cfg.val_fraction or 0)))
    val_idx, train_idx = order[:n_val].sort().values, order[n_val:].sort().values
    pick = lambda idx: ArraySplit(train.inputs[idx], train.targets[idx], train.class_names)  # noqa: E731
    return pick(train_idx), pick(val_idx)


def _array_pair(cfg: DataConfig, train: ArraySplit, test: ArraySplit) -> SplitPair:
    """Validation carved out of train (`data.val_fraction`, the shipped recipes' 0.1) and the test split
    scored once at the end; without a fraction, the guide's set-up: validation is the test split."""
    if cfg.val_fraction:
        train, val = _carve_validation(train, cfg)
        return SplitPair(train, val, train.class_names, test=test)
    pair = SplitPair(train, test, train.class_names)  # the guide scores on the test split
    pair.notes.append("validating on the test split (data.val_fraction=null, the guide's set-up): best.pt and "
                      "early stopping are chosen on test scores; set data.val_fraction=0.1 to hold out validation")
    return pair


def read_cifar10(cfg: DataConfig) -> SplitPair:
    root = _data_root(cfg)
    return _array_pair(cfg, load_cifar10(root, "train", download=cfg.download), load_cifar10(root, "test"))


def _read_idx(dataset: str) -> Callable[[DataConfig], SplitPair]:
    def read(cfg: DataConfig) -> SplitPair:
        root = _data_root(cfg)
        train = load_idx_split(root, "train", dataset=dataset, download=cfg.download)
        return _array_pair(cfg, train, load_idx_split(root, "test", dataset=dataset))

    return read


def read_imdb(cfg: DataConfig) -> SplitPair:
    """Raw reviews -> token ids; the vocabulary is fitted on the training part only and saved with the run."""
    root = _data_root(cfg)
    if cfg.download and not root.exists():
        root = download_imdb(root)
    # Read and standardized once, in a child process (see data/text/child_reader.py): the vocabulary fit and the
    # encoding of every split read these.
    texts = read_standardized_in_worker(root)
    labels = {s: torch.tensor(texts[s][1], dtype=torch.long) for s in texts}
    raw = ArraySplit(torch.arange(len(labels["train"])), labels["train"], list(CLASS_NAMES))
    train_idx, val_idx = _carve_validation(raw, cfg) if cfg.val_fraction else (raw, None)
    reviews = texts["train"][0]
    train_texts = StandardizedTexts(reviews[i] for i in train_idx.inputs.tolist())
    if cfg.text.tokenizer:
        vectorizer = TextVectorizer.load(Path(cfg.text.tokenizer))
    else:
        vectorizer = TextVectorizer.fit(train_texts, max_tokens=cfg.text.max_tokens, seq_len=cfg.text.sequence_length)
    train = ArraySplit(vectorizer.encode(train_texts), train_idx.targets, list(CLASS_NAMES))
    test = ArraySplit(vectorizer.encode(texts["test"][0]), labels["test"], list(CLASS_NAMES))
    if val_idx is None:
        pair = SplitPair(train, test, list(CLASS_NAMES))
    else:
        val_texts = StandardizedTexts(reviews[i] for i in val_idx.inputs.tolist())
        val = ArraySplit(vectorizer.encode(val_texts), val_idx.targets, list(CLASS_NAMES))
        pair = SplitPair(train, val, list(CLASS_NAMES), test=test)
    pair.artifacts["tokenizer.json"] = vectorizer.save
    pair.model_kwargs["vocab_size"] = cfg.text.max_tokens + 1  # Embedding(max_features + 1, ...) as in the guide
    pair.notes.append(f"vocabulary: {vectorizer.vocab_size} ids (padding 0, out-of-vocabulary 1), "
                      f"{cfg.text.sequence_length} tokens per review")
    return pair


def read_imdb_split(cfg: DataConfig, split: str) -> ArraySplit | None:
    """One IMDB split, reading only the reviews it needs: test reads test/, train and val read train/.

    Only with a saved vocabulary (`data.text.tokenizer`, set by `evaluate` from the run): without
    one the vocabulary must be fitted on the training part first, so None sends the caller to
    `read_imdb`. Val and train are carved from train/ exactly as `read_imdb` does (`_carve_validation`).
    """
    if not cfg.text.tokenizer:
        return None
    if split not in ("train", "val", "test"):
        raise UserError(f"--split {split!r}: imdb has the splits train, val, test")
    carved = split != "test" and bool(cfg.val_fraction)
    texts, labels = load_imdb(_data_root(cfg), "train" if carved or split == "train" else "test")
    targets = torch.tensor(labels, dtype=torch.long)
    if carved:
        raw = ArraySplit(torch.arange(len(targets)), targets, list(CLASS_NAMES))
        train_idx, val_idx = _carve_validation(raw, cfg)
        picked = val_idx if split == "val" else train_idx
        texts, targets = [texts[i] for i in picked.inputs.tolist()], picked.targets
    vectorizer = TextVectorizer.load(Path(cfg.text.tokenizer))
    return ArraySplit(vectorizer.encode(texts), targets, list(CLASS_NAMES))


# Readers that can build one split alone for `evaluate` (None: they need the whole pair this time).
ONE_SPLIT_READERS: dict[str, Callable[[DataConfig, str], ArraySplit | None]] = {
    "imdb": read_imdb_split,
}

ARRAY_READERS: dict[str, Callable[[DataConfig], SplitPair]] = {
    "cifar10": read_cifar10,
    "fashion_mnist": _read_idx("fashion"),
    "mnist": _read_idx("mnist"),
    "imdb": read_imdb,
}


def data_warning(cfg: DataConfig) -> str | None:
    """The data check's cheap part (no decoding) on an image folder a recipe reads: one warning line when
    something is wrong, else None. Problems that stop training are left to the reader to say."""
    if cfg.reader not in READERS or cfg.split_file:
        return None
    try:
        root = _reader(cfg).root(cfg)
        findings = quick_check(root, Path(cfg.labels_csv) if cfg.labels_csv else None)
    except (UserError, OSError):
        return None
    return warning_line(findings, Path(cfg.labels_csv) if cfg.labels_csv else root)
