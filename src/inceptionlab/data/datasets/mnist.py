"""Fashion-MNIST and MNIST from their original idx files, as in-memory tensors.

The four files per dataset are `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`,
`t10k-images-idx3-ubyte` and `t10k-labels-idx1-ubyte`, each either plain or gzipped (`.gz`).
They may sit directly in `root` or in `root/raw/` (and `root/FashionMNIST/raw/`,
`root/MNIST/raw/`), the layout torchvision's own datasets use, so a folder torchvision already
downloaded is reused as it is. Debian's `dataset-fashion-mnist` package installs the same four
Fashion-MNIST `.gz` files (under /usr/share/datasets/fashion-mnist/ or similar): pass that folder
as `root`. Nothing here depends on it.

The idx format (http://yann.lecun.com/exdb/mnist/): two zero bytes, a type code, the number of
dimensions, each dimension as a big-endian uint32, then the values in C order, big-endian.
"""

from __future__ import annotations

import gzip
import math
import os
import zlib
from pathlib import Path

import numpy as np
import torch

from inceptionlab.data.io.download import DownloadError, fetch
from inceptionlab.data.splits import ArraySplit
from inceptionlab.errors import UserError

FASHION_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]
MNIST_CLASSES = [str(d) for d in range(10)]
CLASS_NAMES = {"fashion": FASHION_CLASSES, "mnist": MNIST_CLASSES}

# The file name stem for each split: the test files are called t10k ("test 10k").
SPLIT_PREFIX = {"train": "train", "test": "t10k"}

# Copied from torchvision.datasets.MNIST / FashionMNIST (mirrors tried in order; md5 of the .gz).
MIRRORS = {
    "mnist": [
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "http://yann.lecun.com/exdb/mnist/",
    ],
    "fashion": ["http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"],
}
RESOURCES = {
    "mnist": [
        ("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
        ("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432"),
        ("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3"),
        ("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c"),
    ],
    "fashion": [
        ("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
        ("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe"),
        ("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79"),
        ("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310"),
    ],
}
# torchvision keeps its files in root/<ClassName>/raw/.
TORCHVISION_FOLDER = {"mnist": "MNIST", "fashion": "FashionMNIST"}

# idx type code -> numpy dtype; multi-byte values are stored big-endian.
IDX_DTYPES = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
GZIP_MAGIC = b"\x1f\x8b"


# --- the idx format ----------------------------------------------------------------------------


def read_file_bytes(path: Path) -> bytes:
    """The file's content, decompressed if it is gzip (recognised by its magic, not its name)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {path} ({exc.strerror or exc}); check the path") from exc
    if not data.startswith(GZIP_MAGIC):
        return data
    try:
        return gzip.decompress(data)
    except (EOFError, OSError, zlib.error) as exc:
        raise UserError(
            f"{path} is a truncated or corrupt gzip file ({exc}); download it again"
        ) from exc


def parse_idx_header(path: Path, data: bytes) -> tuple[np.dtype, tuple[int, ...], int]:
    """(dtype, shape, offset of the first value) from the idx header, validated."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise UserError(
            f"{path} is not an idx file (it does not start with two zero bytes); "
            "expected an original (Fashion-)MNIST file such as train-images-idx3-ubyte[.gz]"
        )
    type_code, ndim = data[2], data[3]
    if type_code not in IDX_DTYPES:
        raise UserError(f"{path} is not an idx file (unknown type code 0x{type_code:02X})")
    offset = 4 + 4 * ndim
    if len(data) < offset:
        raise UserError(f"{path} is truncated (its header is cut off); download it again")
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    return IDX_DTYPES[type_code], shape, offset


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """The array stored in an idx file (plain or gzipped), in native byte order and writable."""
    path = Path(path)
    data = read_file_bytes(path)
    dtype, shape, offset = parse_idx_header(path, data)
    expected = math.prod(shape) * dtype.itemsize  # Python ints: a hostile header cannot overflow
    actual = len(data) - offset
    if actual < expected:
        raise UserError(
            f"{path} is truncated: its header promises {expected} bytes of data for shape "
            f"{shape} but only {actual} follow; download it again"
        )
    if actual > expected:
        raise UserError(
            f"{path} has {actual - expected} bytes more than its header's shape {shape} "
            "allows; it is not a valid idx file, download it again"
        )
    values = np.frombuffer(data, dtype=dtype, count=expected // dtype.itemsize, offset=offset)
    # frombuffer over bytes is read-only and possibly big-endian; torch needs neither.
    return values.astype(dtype.newbyteorder("="), copy=True).reshape(shape)


# --- finding the files -------------------------------------------------------------------------


def check_dataset(dataset: str) -> None:
    if dataset not in CLASS_NAMES:
        raise UserError(f"unknown idx dataset {dataset!r}; choose one of {sorted(CLASS_NAMES)}")


def check_split(split: str) -> None:
    if split not in SPLIT_PREFIX:
        raise UserError(f"unknown split {split!r} for an idx dataset; choose 'train' or 'test'")


def split_file_names(split: str) -> tuple[str, str]:
    prefix = SPLIT_PREFIX[split]
    return f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"


def candidate_folders(root: Path, dataset: str) -> list[Path]:
    return [root, root / "raw", root / TORCHVISION_FOLDER[dataset] / "raw"]


def existing_variant(folder: Path, name: str) -> Path | None:
    """`name` or `name.gz` in `folder`; the plain file wins because it needs no decompression."""
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def find_split_files(root: Path, split: str, dataset: str) -> tuple[Path, Path] | None:
    """(images, labels) from the first candidate folder holding both, else None."""
    images_name, labels_name = split_file_names(split)
    for folder in candidate_folders(root, dataset):
        images, labels = existing_variant(folder, images_name), existing_variant(folder, labels_name)
        if images and labels:
            return images, labels
    return None


def missing_files_error(root: Path, split: str) -> UserError:
    images_name, labels_name = split_file_names(split)
    return UserError(
        f"{images_name}[.gz] and {labels_name}[.gz] not found in {root} (nor in {root / 'raw'}); "
        f"put the original idx files there, pass --data DIR with the folder that holds them, "
        "or download them"
    )


# --- loading -----------------------------------------------------------------------------------


def check_images(path: Path, images: np.ndarray) -> None:
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (28, 28):
        raise UserError(
            f"{path} holds {images.dtype} values of shape {images.shape}, expected uint8 "
            "(N, 28, 28) images; is it an images file?"
        )


def check_labels(path: Path, labels: np.ndarray, num_classes: int) -> None:
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise UserError(
            f"{path} holds {labels.dtype} values of shape {labels.shape}, expected uint8 (N,) "
            "labels; is it a labels file?"
        )
    if len(labels) and int(labels.max()) >= num_classes:
        raise UserError(
            f"{path} has label {int(labels.max())}, expected 0..{num_classes - 1}; download it again"
        )


def load_idx_split(
    root: str | os.PathLike, split: str, dataset: str = "fashion", download: bool = False
) -> ArraySplit:
    """One split of Fashion-MNIST (`dataset="fashion"`) or MNIST (`"mnist"`): (N, 1, 28, 28) uint8."""
    check_dataset(dataset)
    check_split(split)
    root = Path(root)
    found = find_split_files(root, split, dataset)
    if found is None and download:
        download_idx(root, dataset)
        found = find_split_files(root, split, dataset)
    if found is None:
        raise missing_files_error(root, split)
    images_path, labels_path = found
    images, labels = read_idx(images_path), read_idx(labels_path)
    check_images(images_path, images)
    check_labels(labels_path, labels, len(CLASS_NAMES[dataset]))
    if len(images) != len(labels):
        raise UserError(
            f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels; "
            "they must come from the same download"
        )
    return ArraySplit(
        inputs=torch.from_numpy(images).unsqueeze(1),
        targets=torch.from_numpy(labels.astype(np.int64)),
        class_names=list(CLASS_NAMES[dataset]),
    )


# --- download ----------------------------------------------------------------------------------


def download_idx(root: str | os.PathLike, dataset: str = "fashion") -> Path:
    """Fetch the four `.gz` files of `dataset` into `root` (skipping those present); returns `root`."""
    check_dataset(dataset)
    root = Path(root)
    missing = [
        (name, md5) for name, md5 in RESOURCES[dataset]
        if not any(existing_variant(folder, name.removesuffix(".gz"))
                   for folder in candidate_folders(root, dataset))
    ]
    failed = [name for name, md5 in missing if not fetch_from_mirrors(root / name, dataset, md5)]
    if failed:
        raise UserError(
            f"could not download {', '.join(failed)} for {dataset} (offline?); put the original "
            f"files (from {MIRRORS[dataset][0]}) in {root} and run again"
        )
    return root


def fetch_from_mirrors(dest: Path, dataset: str, md5: str) -> bool:
    """True once `dest` is downloaded and verified; False if every mirror was unreachable."""
    for mirror in MIRRORS[dataset]:
        try:
            fetch(mirror + dest.name, dest, md5=md5)
            return True
        except DownloadError:
            continue  # the next mirror may work; a checksum mismatch is a UserError and stops
    return False
