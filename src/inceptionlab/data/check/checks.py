"""The checks: each turns the listing (and the scanned facts) into findings that name files and say what to do.

Severity: `error` changes what a score means or what can be trained (the same image in train and val,
one image under two classes, a class with no training images, files that do not decode); `warning`
costs accuracy or time (copies, imbalance, tiny or extreme images); `info` is worth knowing.

Near copies: pHash within NEAR_PHASH bits and dHash within NEAR_DHASH bits. Measured on the 14,200
tiny-imagenet-200 images here: copies resized to 1/2, 0.7 (JPEG q50) or 2x, re-encoded at JPEG q30,
converted to PNG or grey differ by at most 6 pHash bits and 10 dHash bits (108 source images: tiny-imagenet
and the imagenet-sample photos); two different images were never closer than 8 pHash bits, and the pairs
at 8 differ by 5 to 31 dHash bits. Both thresholds together keep distinct images apart. (A 5% crop moves
pHash by up to 14 bits: crops are not near copies here.)
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from inceptionlab.data.check.listing import DataListing, SplitListing
from inceptionlab.data.check.scan import FileFacts
from inceptionlab.data.io.decode import HEIF_INSTALL
from inceptionlab.data.io.image_files import IMAGE_EXTENSIONS

NEAR_PHASH = 6  # bits of 64
NEAR_DHASH = 10
PHASH_CHUNKS = NEAR_PHASH + 1  # pigeonhole: two hashes within 6 bits agree exactly on one of 7 chunks
MIN_SIDE = 32  # px: a shorter side below this is upscaled ~10x to Inception's 299
MAX_PIXELS = 40_000_000  # the server's upload limit; decoding such images costs ~0.5 s each
MAX_ASPECT = 3.0  # long side / short side: a centre crop keeps a third or less
IMBALANCE_RATIO = 3.0  # most / fewest training images per class
FEW_IMAGES = 5  # training images per class below which a class is barely learnt
BLANK_STD = 2.0  # grey-level standard deviation (0-255) below which an image is one flat colour
SEVERITIES = ("error", "warning", "info")
EXAMPLES = 5  # files (or groups) a text report shows per finding; --json lists all


@dataclass
class Finding:
    check: str
    severity: str
    message: str  # what was found, one line
    advice: str  # what to do about it
    files: list[Any] = field(default_factory=list)  # paths, or groups of paths (copies)
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def relative(path: str, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path


# --------------------------------------------------------------------------------------- from the listing


def layout_findings(listing: DataListing) -> list[Finding]:
    out: list[Finding] = []
    root = listing.root
    for split in listing.splits:
        if split.loose:
            out.append(Finding("loose_images", "warning",
                               f"{len(split.loose)} image(s) directly in {relative(str(split.root), root)}/, in no class folder",
                               f"move them into {relative(str(split.root), root)}/<class>/, or they are not used",
                               [relative(p, root) for p in split.loose]))
        if split.ignored:
            out.append(Finding("not_images", "info", f"{len(split.ignored)} file(s) in class folders are not read as images",
                               "nothing to do for notes and sidecar files; a picture among them must be converted to "
                               f"one of {', '.join(IMAGE_EXTENSIONS)} to be used",
                               [relative(p, root) for p in split.ignored]))
        counts = Counter(label for _, label in split.samples)
        empty = [c for i, c in enumerate(split.classes) if counts[i] == 0]
        if empty:
            out.append(Finding("empty_classes", "error", f"{len(empty)} class folder(s) of {split.name} hold no images",
                               "add images or remove the folders: training refuses an empty class",
                               [relative(str(split.root / c), root) for c in empty]))
    out += _class_set_findings(listing)
    return out


def _class_set_findings(listing: DataListing) -> list[Finding]:
    by_name = {s.name: s for s in listing.splits}
    train = by_name.get("train") or by_name.get("all")
    out: list[Finding] = []
    if train is None:
        return [Finding("no_train", "error", "no train/ split folder", f"put the training images under "
                        f"{listing.root}/train/<class>/ (or all images under {listing.root}/<class>/ to have a "
                        "validation split made)")]
    for split in listing.splits:
        if split is train or split.classes == train.classes:
            continue
        if not split.classes and split.samples:  # unlabelled (listing._unlabelled_if_flat)
            out.append(_unlabelled(split, listing.root))
            continue
        only_here = sorted(set(split.classes) - set(train.classes))
        missing = sorted(set(train.classes) - set(split.classes))
        if only_here:
            out.append(Finding("class_mismatch", "error", f"{len(only_here)} class(es) of {split.name} have no "
                               "training folder", "add their training images or remove them: the model has no "
                               "output for them", only_here))
        if missing:
            out.append(Finding("class_mismatch", "warning", f"{len(missing)} training class(es) have no "
                               f"{split.name} folder", f"add {split.name} images of them: their accuracy goes "
                               "unmeasured", missing))
    return out


def _unlabelled(split: SplitListing, root: Path) -> Finding:
    if split.name != "val":
        return Finding("unlabelled_split", "info", f"{split.name}/ has no class folders (unlabelled images, as "
                       "Tiny ImageNet's test/)", "nothing to do to train; its images are still checked for copies of "
                       "training images")
    annotations = sorted(p.name for p in split.root.glob("*_annotations.txt"))
    advice = (f"run `inceptionlab data tiny-imagenet --root {root}` to sort them by class" if annotations else
              f"sort them into {split.name}/<class>/ folders: training needs their labels")
    return Finding("unlabelled_split", "error", f"{split.name}/ holds its images in one images/ folder, not in class "
                   "folders", advice)


def count_findings(listing: DataListing) -> list[Finding]:
    """Imbalance (with class weights to use), classes with few images, classes without validation images."""
    train = next((s for s in listing.splits if s.name in ("train", "all")), None)
    if train is None or not train.classes:
        return []
    counts = per_class(train)
    present = {c: n for c, n in counts.items() if n > 0}
    out: list[Finding] = []
    if present and max(present.values()) >= IMBALANCE_RATIO * min(present.values()):
        weights = class_weights(present)
        most, fewest = max(present, key=present.get), min(present, key=present.get)
        out.append(Finding(
            "imbalance", "warning",
            f"classes are imbalanced: {present[most]} {_images(train)} of {most}, {present[fewest]} of {fewest} "
            f"({present[most] / present[fewest]:.1f}x)",
            "weight the loss by class (--set train.class_weights=auto: the weights below) or draw classes evenly "
            "(--set data.sampler=balanced); judge the model by per-class recall, not top-1 alone; or collect more "
            "images of the small classes", [], {"weights": weights, "counts": present}))
    few = sorted((c for c, n in present.items() if n < FEW_IMAGES), key=present.get)
    if few:
        out.append(Finding("few_images", "warning", f"{len(few)} class(es) have fewer than {FEW_IMAGES} "
                           f"{_images(train)}", "collect more images of them: a class seen this rarely is "
                           "barely learnt", few, {"counts": {c: present[c] for c in few}}))
    val = next((s for s in listing.splits if s.name == "val"), None)
    if val is not None and val.classes == train.classes:
        val_counts = per_class(val)
        unmeasured = [c for c, n in val_counts.items() if n == 0 and present.get(c)]
        if unmeasured:
            out.append(Finding("no_validation", "warning", f"{len(unmeasured)} class(es) have no validation images",
                               "add validation images of them: their accuracy goes unmeasured", unmeasured))
    return out


def _images(split: SplitListing) -> str:
    """"train images", or plain "images" for a folder of class folders (listed as the split "all")."""
    return "images" if split.name == "all" else f"{split.name} images"


def per_class(split: SplitListing) -> dict[str, int]:
    counts = Counter(label for _, label in split.samples)
    return {c: counts[i] for i, c in enumerate(split.classes)}


def class_weights(counts: dict[str, int]) -> dict[str, float]:
    """The loss weights `train.class_weights=auto` trains with: 1 / n_c, normalised to a mean of 1 over
    the classes (data/loading/sampler.inverse_frequency at power 1; a test keeps the two equal)."""
    inverse = {c: 1.0 / n for c, n in counts.items()}
    mean = sum(inverse.values()) / len(inverse)
    return {c: round(w / mean, 4) for c, w in inverse.items()}


# --------------------------------------------------------------------------------------- from the scanned facts


def decode_findings(facts: list[FileFacts], root: Path) -> list[Finding]:
    """Damaged files apart from photos in a format this installation has no reader for (HEIC without
    pillow-heif): those are the user's photos, and installing the reader is the fix, not deleting them."""
    out = []
    damaged = [f for f in facts if f.error and not f.needs_reader]
    if damaged:
        out.append(Finding("undecodable", "error", f"{len(damaged)} file(s) cannot be read as images",
                           "re-save them from the source or delete them; training skips them and says so every epoch",
                           [relative(f.path, root) for f in damaged],
                           {"reasons": {relative(f.path, root): f.error for f in damaged}}))
    unread = [f for f in facts if f.needs_reader]
    if unread:
        needs = sorted({f.error for f in unread if f.error})
        out.append(Finding("needs_reader", "error", f"{len(unread)} image(s) in a format this installation cannot read",
                           f"install what reads them ({HEIF_INSTALL} for HEIC/HEIF photos; Pillow >= 11.3 for AVIF), "
                           "or convert them to JPEG; until then training skips them",
                           [relative(f.path, root) for f in unread], {"reasons": needs}))
    return out


def image_findings(facts: list[FileFacts], root: Path) -> list[Finding]:
    """Odd sizes, aspect ratios, modes and blank images."""
    ok = [f for f in facts if f.decoded]
    out: list[Finding] = []
    tiny = [f for f in ok if min(f.width, f.height) < MIN_SIDE]
    if tiny:
        out.append(Finding("small_images", "warning", f"{len(tiny)} image(s) have a side under {MIN_SIDE} px",
                           "check they are what you meant to collect (thumbnails?): they are upscaled many times to "
                           "the model's input", _names(tiny, root), {"sizes": _sizes(tiny, root)}))
    huge = [f for f in ok if f.width * f.height > MAX_PIXELS]
    if huge:
        out.append(Finding("huge_images", "warning", f"{len(huge)} image(s) have more than {MAX_PIXELS // 10**6} Mpx",
                           "downscale them once (the model sees ~300 px): each costs ~0.5 s to decode every epoch",
                           _names(huge, root), {"sizes": _sizes(huge, root)}))
    wide = [f for f in ok if max(f.width, f.height) > MAX_ASPECT * min(f.width, f.height)]
    if wide:
        out.append(Finding("aspect_ratio", "warning", f"{len(wide)} image(s) are more than {MAX_ASPECT:g}x as long "
                           "as wide", "crop them to the object, or pad them to a square: the centre crop keeps a "
                           "third or less of each", _names(wide, root), {"sizes": _sizes(wide, root)}))
    modes = Counter(f.mode for f in ok)
    main = modes.most_common(1)[0][0] if modes else None
    odd = [f for f in ok if f.mode not in ("RGB", "L") or (f.mode != main and main in ("RGB", "L"))]
    if odd:
        by_mode = Counter(f.mode for f in odd)
        out.append(Finding("modes", "info", f"{len(odd)} image(s) are not in the data set's usual {main} mode ("
                           f"{', '.join(f'{n} {m}' for m, n in by_mode.most_common())})",
                           "nothing to do unless it is unexpected: images are converted to the model's channels "
                           "(alpha dropped, palettes and CMYK converted, grey replicated to RGB)",
                           _names(odd, root), {"modes": dict(by_mode)}))
    return out


def _names(facts: list[FileFacts], root: Path) -> list[str]:
    return [relative(f.path, root) for f in facts]


def _sizes(facts: list[FileFacts], root: Path) -> dict[str, list[int]]:
    return {relative(f.path, root): [f.width, f.height] for f in facts}


# --------------------------------------------------------------------------------------- copies


@dataclass
class Where:
    split: str
    label: str | None  # None: an unlabelled split


def copy_groups(facts: list[FileFacts], near: bool) -> tuple[list[list[int]], list[list[int]]]:
    """(exact groups, near groups) as lists of indices into `facts`: exact = the same bytes; near = images
    linked by near-copy pairs (connected components) with all the exact copies of each, which are then
    not an exact group of their own: each file is in one group at most."""
    by_sha: dict[str, list[int]] = defaultdict(list)
    for i, f in enumerate(facts):
        if f.decoded or f.bytes:
            by_sha[f.sha256].append(i)
    exact = [g for g in by_sha.values() if len(g) > 1 and facts[g[0]].bytes]
    if not near:
        return exact, []
    heads = [g[0] for g in by_sha.values() if facts[g[0]].decoded and not _blank(facts[g[0]])]
    parent = {i: i for i in heads}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in near_pairs(np.array([facts[i].phash for i in heads], np.uint64),
                           np.array([facts[i].dhash for i in heads], np.uint64)):
        parent[find(heads[a])] = find(heads[b])
    components: dict[int, list[int]] = defaultdict(list)
    for head in heads:
        components[find(head)].extend(by_sha[facts[head].sha256])
    near_groups = [sorted(g) for g in components.values() if len({facts[i].sha256 for i in g}) > 1]
    # A near group holds every file of each content it links: its exact copies are listed with it, once.
    in_near = {i for g in near_groups for i in g}
    return [g for g in exact if g[0] not in in_near], near_groups


def near_pairs(phash: np.ndarray, dhash: np.ndarray) -> Iterable[tuple[int, int]]:
    """Index pairs within NEAR_PHASH pHash bits and NEAR_DHASH dHash bits, without comparing all pairs:
    two 64-bit hashes within 6 bits agree exactly on at least one of 7 chunks (pigeonhole), so only
    hashes sharing a chunk value are compared (multi-index hashing)."""
    found: set[tuple[int, int]] = set()
    bounds = np.linspace(0, 64, PHASH_CHUNKS + 1).astype(int)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        keys = (phash >> np.uint64(lo)) & np.uint64((1 << (hi - lo)) - 1)
        order = np.argsort(keys, kind="stable")
        edges = np.flatnonzero(np.diff(keys[order])) + 1
        for group in np.split(order, edges):
            if len(group) < 2:
                continue
            p, d = phash[group], dhash[group]
            for start in range(0, len(group), BLOCK):  # rows in blocks: a big group never makes an n x n matrix
                rows = slice(start, start + BLOCK)
                close = (popcount(p[rows, None] ^ p[None, :]) <= NEAR_PHASH) & \
                        (popcount(d[rows, None] ^ d[None, :]) <= NEAR_DHASH)
                for a, b in zip(*np.nonzero(close)):
                    if start + a < b:
                        found.add((int(group[start + a]), int(group[b])))
    return sorted(found)


BLOCK = 1024
_BYTE_BITS = np.array([bin(i).count("1") for i in range(256)], np.uint8)


def popcount(values: np.ndarray) -> np.ndarray:
    """Set bits per uint64 (numpy >= 2 has it built in; older numpy counts bytes)."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(values)
    as_bytes = np.ascontiguousarray(values).view(np.uint8).reshape(*values.shape, 8)
    return _BYTE_BITS[as_bytes].sum(axis=-1)


def copy_findings(facts: list[FileFacts], where: list[Where], root: Path, near: bool) -> list[Finding]:
    """Copies within a split (same class: waste; other classes: a label conflict) and across splits (leakage)."""
    exact, near_groups = copy_groups(facts, near)
    kinds: dict[str, list[list[str]]] = defaultdict(list)
    for kind, groups in (("exact", exact), ("near", near_groups)):
        for group in groups:
            splits = {where[i].split for i in group}
            names = [relative(facts[i].path, root) for i in group]
            labels = {where[i].label for i in group if where[i].label is not None}
            if len(splits) > 1:
                kinds["leakage"].append(names)
            elif len(labels) > 1:
                kinds["label_conflict"].append(names)
            else:
                kinds[f"{kind}_duplicates"].append(names)
    out = []
    if kinds["leakage"]:
        groups = kinds["leakage"]
        out.append(Finding("leakage", "error", f"{len(groups)} image(s) appear in more than one split "
                           f"({sum(len(g) for g in groups)} files, exact or near copies)",
                           "keep each image in one split only (delete it from val/ or test/): validation counts a "
                           "copy of a training image as unseen, and the score a checkpoint is chosen by is inflated",
                           groups))
    if kinds["label_conflict"]:
        groups = kinds["label_conflict"]
        out.append(Finding("label_conflict", "error", f"{len(groups)} image(s) are filed under more than one class",
                           "decide each one's class and delete the other copies: the model is taught both answers",
                           groups))
    for kind, what in (("exact_duplicates", "identical files"), ("near_duplicates", "near copies (resized or "
                                                                                    "re-encoded)")):
        if kinds[kind]:
            groups = kinds[kind]
            extra = sum(len(g) - 1 for g in groups)
            out.append(Finding(kind, "warning", f"{len(groups)} group(s) of {what} within a class "
                               f"({extra} extra file(s))", "keep one of each group: copies count an image several "
                               "times in training and in the validation score", groups))
    return out


def _blank(facts: FileFacts) -> bool:
    return facts.decoded and facts.std is not None and facts.std < BLANK_STD


def blank_findings(facts: list[FileFacts], root: Path) -> list[Finding]:
    """Flat images (every flat image hashes alike, so they are left out of the near-copy search)."""
    blank = [f for f in facts if _blank(f)]
    if not blank:
        return []
    return [Finding("blank_images", "warning", f"{len(blank)} image(s) are one flat colour",
                    "check them (failed downloads and placeholders look like this); delete them if they show nothing",
                    _names(blank, root))]
