"""CIFAR-10 from its original "python version" batches, as in-memory tensors.

The archive https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz unpacks to
`cifar-10-batches-py/` holding `data_batch_1` .. `data_batch_5` (training, 10,000 images each),
`test_batch` and `batches.meta`. Each batch is a pickled dict with bytes keys: `b"data"`, a uint8
array (N, 3072) whose rows are 1024 red, 1024 green then 1024 blue values (each plane a row-major
32x32 image), `b"labels"` (N ints 0..9), `b"filenames"` and `b"batch_label"`. `batches.meta`
holds `b"label_names"`.

Security: unpickling can run arbitrary code (a pickle may call any importable function, e.g.
`os.system`), and these files come from the network or from whoever shared a folder. They are
therefore read with `RestrictedUnpickler`, which resolves only the few numpy names an array needs
and refuses everything else before it is called.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import torch

try:
    from numpy._core.multiarray import _reconstruct  # numpy >= 2 (and 1.26's alias)
except ImportError:  # pragma: no cover - older numpy
    from numpy.core.multiarray import _reconstruct

from inceptionlab.data.io.archives import safe_extract_tar
from inceptionlab.data.io.download import DownloadError, fetch
from inceptionlab.data.splits import ArraySplit
from inceptionlab.errors import UserError

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
MD5 = "c58f30108f718f92721af3b95e74349a"
ARCHIVE_NAME = "cifar-10-python.tar.gz"
BATCHES_DIR = "cifar-10-batches-py"
META_FILE = "batches.meta"
SPLIT_FILES = {
    "train": [f"data_batch_{i}" for i in range(1, 6)],
    "test": ["test_batch"],
}
NUM_CLASSES = 10
IMAGE_SHAPE = (3, 32, 32)
ROW_BYTES = 3 * 32 * 32


# --- restricted unpickling ---------------------------------------------------------------------


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    """`_codecs.encode` as pickle protocol 2 calls it: Python 3 writes each bytes value as
    `_codecs.encode(<the bytes as latin-1 text>, "latin1")`, which rebuilds the same bytes (PyTorch's
    weights_only unpickler allows it for the same reason). Any other codec or argument is refused."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise ForbiddenGlobal("_codecs", f"encode with {type(text).__name__} and codec {encoding!r}")
    return text.encode("latin1")


# Everything a pickled numpy array needs, and nothing else. The original batches were written by
# Python 2 with numpy 1.x (`numpy.core`); files re-pickled with numpy 2 name `numpy._core`; Python 3
# with protocol 2 writes bytes through `_codecs.encode`.
_ALLOWED_GLOBALS = {
    ("_codecs", "encode"): _latin1_bytes,
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class ForbiddenGlobal(pickle.UnpicklingError):
    """The pickle asked for a callable outside the allow-list: it is not a plain CIFAR batch."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name
        super().__init__(f"{module}.{name} is not allowed")


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that can rebuild numpy arrays but cannot import or call anything else."""

    def find_class(self, module: str, name: str):
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise ForbiddenGlobal(module, name) from None


def load_pickle(path: Path) -> object:
    """Unpickle `path` safely; any failure becomes a UserError naming the file."""
    try:
        with open(path, "rb") as f:
            # encoding="bytes": Python 2 `str` values (keys, raw array bytes) stay bytes.
            return RestrictedUnpickler(f, encoding="bytes").load()
    except ForbiddenGlobal as exc:
        raise UserError(
            f"refusing to load {path}: it asks for {exc.module}.{exc.name}, which a CIFAR-10 "
            "batch never contains (unpickling it could run arbitrary code); replace the file "
            "with the original"
        ) from exc
    except OSError as exc:
        raise UserError(f"cannot read {path} ({exc.strerror or exc}); check the path") from exc
    except Exception as exc:  # a damaged pickle can raise almost any type
        raise UserError(
            f"{path} is not a readable CIFAR-10 pickle (truncated or corrupt: "
            f"{type(exc).__name__}: {exc}); extract or download it again"
        ) from exc


def field(path: Path, content: object, key: str) -> object:
    """`content[b"key"]` (original files), or `content["key"]` (files pickled with str keys)."""
    if not isinstance(content, dict):
        raise UserError(
            f"{path} holds a {type(content).__name__}, not a CIFAR-10 dict; replace it with the original"
        )
    for candidate in (key.encode(), key):
        if candidate in content:
            return content[candidate]
    raise UserError(f"{path} has no {key!r} entry; it is not a CIFAR-10 batch file")


# --- reading -----------------------------------------------------------------------------------


def read_label_names(path: Path) -> list[str]:
    names = field(path, load_pickle(path), "label_names")
    if not isinstance(names, list) or len(names) != NUM_CLASSES or not all(
        isinstance(n, (bytes, str)) for n in names
    ):
        raise UserError(f"{path}: 'label_names' is not a list of {NUM_CLASSES} names; replace it with the original")
    return [n.decode("utf-8") if isinstance(n, bytes) else n for n in names]


def batch_data(path: Path, content: object) -> np.ndarray:
    data = field(path, content, "data")
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2
            and data.shape[1] == ROW_BYTES):
        shape = getattr(data, "shape", None)
        kind = getattr(data, "dtype", type(data).__name__)
        raise UserError(
            f"{path}: 'data' is {kind} with shape {shape}, expected uint8 (N, {ROW_BYTES}); "
            "replace it with the original"
        )
    return data


def batch_labels(path: Path, content: object, count: int) -> np.ndarray:
    raw = field(path, content, "labels")
    labels = np.asarray(raw) if isinstance(raw, (list, tuple, np.ndarray)) else None
    if labels is None or labels.ndim != 1 or (labels.size and labels.dtype.kind not in "iu"):
        raise UserError(f"{path}: 'labels' is not a list of integers; replace it with the original")
    if len(labels) != count:
        raise UserError(f"{path} has {count} images but {len(labels)} labels; replace it with the original")
    out_of_range = labels[(labels < 0) | (labels >= NUM_CLASSES)]
    if out_of_range.size:
        raise UserError(
            f"{path} has label {int(out_of_range[0])}, expected 0..{NUM_CLASSES - 1}; "
            "replace it with the original"
        )
    return labels.astype(np.int64)


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(data uint8 (N, 3072), labels int64 (N,)) of one batch file, validated."""
    content = load_pickle(path)
    data = batch_data(path, content)
    return data, batch_labels(path, content, len(data))


def find_batches_dir(root: Path) -> Path:
    """`root/cifar-10-batches-py` if present, else `root` itself when it looks like that folder."""
    nested = root / BATCHES_DIR
    if nested.is_dir():
        return nested
    expected = [META_FILE, *SPLIT_FILES["train"], *SPLIT_FILES["test"]]
    if root.name == BATCHES_DIR or any((root / name).exists() for name in expected):
        return root
    return nested  # where the files should be; the missing-file error names it


def split_paths(folder: Path, split: str) -> list[Path]:
    return [folder / META_FILE, *(folder / name for name in SPLIT_FILES[split])]


def require_files(paths: list[Path]) -> None:
    for path in paths:
        if not path.is_file():
            raise UserError(
                f"{path} not found; pass --data DIR with the extracted {BATCHES_DIR} folder "
                f"(or the folder containing it), or download it ({URL})"
            )


def load_cifar10(root: str | os.PathLike, split: str, download: bool = False) -> ArraySplit:
    """The CIFAR-10 `split` ("train": data_batch_1..5 in order, "test": test_batch) in memory."""
    if split not in SPLIT_FILES:
        raise UserError(f"unknown CIFAR-10 split {split!r}; choose 'train' or 'test'")
    root = Path(root)
    folder = find_batches_dir(root)
    if download and not all(p.is_file() for p in split_paths(folder, split)):
        folder = download_cifar10(root)
    paths = split_paths(folder, split)
    require_files(paths)
    class_names = read_label_names(paths[0])
    batches = [read_batch(path) for path in paths[1:]]
    data = np.concatenate([d for d, _ in batches]).reshape(-1, *IMAGE_SHAPE)
    labels = np.concatenate([lab for _, lab in batches])
    return ArraySplit(torch.from_numpy(data), torch.from_numpy(labels), class_names)


# --- download and safe extraction --------------------------------------------------------------


def download_cifar10(root: str | os.PathLike) -> Path:
    """Fetch and extract the archive into `root` (once); returns `root/cifar-10-batches-py`."""
    root = Path(root)
    batches = root / BATCHES_DIR
    if all(p.is_file() for p in split_paths(batches, "train") + split_paths(batches, "test")):
        return batches
    archive = root / ARCHIVE_NAME
    try:
        fetch(URL, archive, md5=MD5)
    except DownloadError as exc:
        raise UserError(
            f"could not download {URL} ({exc.reason}); put {ARCHIVE_NAME} at {archive} "
            f"(or extract it so that {batches} exists) and run again"
        ) from exc
    safe_extract_tar(archive, root)
    return batches
