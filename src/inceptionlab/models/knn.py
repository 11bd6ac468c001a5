"""How far an input lies from the training data: the deep k-nearest-neighbour score (Sun et al., ICML 2022).

The score of an image is the Euclidean distance from its L2-normalised penultimate features
(models/penultimate.py) to the k-th nearest of the training images' normalised features, the *bank*.
A softmax threshold rejects what the model is unsure of; a network is sure of many things it has never
seen (the Fashion-MNIST MLP calls CIFAR-10 photographs a garment with median probability 0.999), and
their features still lie far from every training image's. Above the distance threshold the answer is
"unknown", for the reason FAR.

The bank is stored beside model.pt (BANK_FILE, float32 .npy of unit rows) and described in spec.json
(`KnnRule`, part of the decision rule in models/rule.py): its rows, the training images they were drawn
from, its size in bytes, k and the threshold with the coverage it was chosen for. Where the training
split would make a bank above MAX_BANK_BYTES, a seeded random subsample of rows is kept (Sun et al.
study the sampling ratio on ImageNet and find a small random share of the training features nearly as
good as all of them), and `sampled` says so.

Search: one matrix product of the (unit) queries with the bank and `topk`, in chunks of queries: for unit
vectors |a - b|^2 = 2 - 2 a.b, so the product gives every distance. A 5,000 x 2,048 bank costs ~20 MFLOP
per image; no index library is needed at these sizes (faiss is not installed here either).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from inceptionlab.errors import UserError
from inceptionlab.fileio import atomic_write, sha256_file

BANK_FILE = "feature_bank.npy"
DEFAULT_K = 50  # Sun et al.'s k for CIFAR-10 (50,000 training images)
# k is at most this share of an average class's rows: the k-th neighbour of an image of a class must
# still lie in that class (30 rows of 3 classes with k = 30 made every distance the farthest image's, and
# noise scored nearer than the validation squares).
K_SHARE_OF_CLASS = 0.05


def choose_k(rows: int, classes: int, k: int = DEFAULT_K) -> int:
    """DEFAULT_K, or fewer where the bank's classes hold fewer than k / K_SHARE_OF_CLASS rows each."""
    return max(1, min(k, int(rows / max(classes, 1) * K_SHARE_OF_CLASS)))
# 256 MB of float32 rows: 32,768 features of Inception v3's 2,048 (tiny-imagenet's 100,000 training
# images would make 800 MB, loaded by every serving process).
MAX_BANK_BYTES = 256 * 2**20
QUERY_CHUNK = 1024  # queries per matrix product: 1,024 x 32,768 similarities are 128 MB of float32
FAR = "far from the training data"  # why an answer is unknown: the kNN distance is above its threshold
# A feature's length outside [shortest / NORM_MARGIN, longest x NORM_MARGIN] of the training and validation
# features' is as far as a unit vector can be (FARTHEST). Normalising keeps only the direction: the demo digits
# model maps uniform noise to features ~200x longer than a digit's, pointing where the 6s do, and all noise
# was answered under the distance alone (benchmarks/unknown.py, AMD EPYC Zen 4, 2026-12-05). 2: a margin
# wide enough that no in-distribution image the fit saw comes near it.
NORM_MARGIN = 2.0
FARTHEST = 2.0  # the largest distance between two unit vectors


def normalised(features: Any) -> torch.Tensor:
    """Rows scaled to unit length (float32); a zero row stays zero."""
    x = torch.as_tensor(np.asarray(features) if not isinstance(features, torch.Tensor) else features)
    x = x.detach().float().cpu()
    return x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)


def kth_distance(queries: Any, bank: Any, k: int) -> np.ndarray:
    """float64 (N,): the distance from each normalised query to its k-th nearest normalised bank row."""
    q, b = normalised(queries), torch.as_tensor(bank).float()
    k = min(k, len(b))
    out = []
    for start in range(0, len(q), QUERY_CHUNK):
        similarity = q[start:start + QUERY_CHUNK] @ b.T
        kth = similarity.topk(k, dim=1).values[:, -1].double()
        out.append((2.0 - 2.0 * kth).clamp_min(0.0).sqrt())
    return torch.cat(out).numpy() if out else np.zeros(0)


def norm_range(*features: Any) -> tuple[float, float]:
    """[shortest / NORM_MARGIN, longest x NORM_MARGIN] of these rows' lengths: the lengths a feature may have."""
    norms = torch.cat([torch.as_tensor(np.asarray(f)).double().reshape(len(f), -1).norm(dim=1) for f in features])
    return float(norms.min()) / NORM_MARGIN, float(norms.max()) * NORM_MARGIN


def bank_rows(count: int, dim: int, max_bytes: int = MAX_BANK_BYTES, seed: int = 0) -> np.ndarray | None:
    """The training rows a bank keeps: None for all of them, else a seeded random subsample that fits
    max_bytes (sorted, so the bank keeps the split's order)."""
    fits = max(1, max_bytes // (4 * max(dim, 1)))
    if count <= fits:
        return None
    return np.sort(np.random.default_rng(seed).choice(count, size=fits, replace=False))


@dataclass(frozen=True)
class KnnRule:
    """The unknown detector saved in spec.json: the bank's description, k, the distance threshold above
    which the answer is unknown (FAR), and the coverage of validation it was chosen for."""

    k: int
    threshold: float  # kNN distance above which the answer is "unknown"
    target: str  # e.g. "coverage=0.95": the share of validation images within the threshold
    rows: int  # feature vectors in the bank
    dim: int  # their length
    images: int  # training images they were drawn from
    sampled: str  # "all" or how the rows were drawn
    layer: str  # the head layer whose input the features are
    file: str = BANK_FILE  # beside spec.json and model.pt
    sha256: str = ""  # of the file: a bank that no longer matches is refused
    # Feature lengths outside it are FARTHEST (see NORM_MARGIN); None in rules saved before it existed.
    norm_range: Optional[tuple[float, float]] = None
    home: str | None = field(default=None, compare=False, repr=False)  # the run directory (not saved)

    def __post_init__(self) -> None:
        if self.k < 1 or self.threshold < 0:
            raise ValueError(f"kNN rule k={self.k!r}, threshold={self.threshold!r}: k must be >= 1, threshold >= 0")
        if self.norm_range is not None:
            object.__setattr__(self, "norm_range", (float(self.norm_range[0]), float(self.norm_range[1])))

    @property
    def bytes(self) -> int:
        return 4 * self.rows * self.dim

    def located(self, home: Path) -> "KnnRule":
        return dataclasses.replace(self, home=str(home))

    @property
    def path(self) -> Path:
        if self.home is None:
            raise ValueError("the kNN rule's bank has no home: load the spec from its run directory")
        return Path(self.home) / self.file

    def bank(self) -> torch.Tensor:
        """The bank's unit rows (read once per process and kept: the file is ~rows x dim x 4 bytes)."""
        return _read_bank(str(self.path), self.sha256)

    def distances(self, features: Any) -> np.ndarray:
        """The k-th nearest bank row's distance of each feature's direction; FARTHEST where its length lies
        outside norm_range."""
        distances = kth_distance(features, self.bank(), self.k)
        if self.norm_range is not None and len(distances):
            lengths = torch.as_tensor(np.asarray(features) if not isinstance(features, torch.Tensor) else features)
            lengths = lengths.detach().double().cpu().reshape(len(distances), -1).norm(dim=1).numpy()
            low, high = self.norm_range
            distances = np.where((lengths < low) | (lengths > high), FARTHEST, distances)
        return distances

    def far(self, distances: np.ndarray) -> np.ndarray:
        """Which distances lie beyond the threshold: the one comparison evaluate's promise and every answer make."""
        return np.asarray(distances, dtype=np.float64) > self.threshold

    def describe(self) -> str:
        lengths = "" if self.norm_range is None else \
            f", or a feature length outside {self.norm_range[0]:.3g}-{self.norm_range[1]:.3g}"
        return (f"unknown beyond kNN distance {self.threshold:.4f}{lengths} [{self.target}; k={self.k}, bank of "
                f"{self.rows:,} x {self.dim} features ({self.bytes / 2**20:.1f} MiB, {self.sampled} of "
                f"{self.images:,} training images)]")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("home")
        return out


_BANKS: dict[tuple[str, str], torch.Tensor] = {}


def _read_bank(path: str, sha256: str) -> torch.Tensor:
    key = (path, sha256)
    if key not in _BANKS:
        try:
            data = Path(path).read_bytes()
        except OSError:
            raise UserError(f"{path}: the kNN feature bank spec.json names is missing; run `inceptionlab evaluate "
                            f"{Path(path).parent} --unknown coverage=0.95` to make it again, or --unknown none "
                            "to drop it") from None
        if sha256 and hashlib.sha256(data).hexdigest() != sha256:
            raise UserError(f"{path}: the kNN feature bank is not the one spec.json records (sha256 differs); "
                            f"run `inceptionlab evaluate {Path(path).parent}` again to refit it")
        _BANKS[key] = torch.from_numpy(np.load(io.BytesIO(data))).float()
    return _BANKS[key]


def save_bank(features: Any, home: Path, *, images: int, sampled: str, layer: str, k: int, threshold: float,
              target: str, lengths: Optional[tuple[float, float]] = None) -> KnnRule:
    """Write the normalised bank beside model.pt (atomically) and describe it."""
    bank = normalised(features).numpy().astype(np.float32)
    path = Path(home) / BANK_FILE
    atomic_write(path, lambda handle: np.save(handle, bank))
    return KnnRule(k=min(k, len(bank)), threshold=float(threshold), target=target, rows=len(bank), dim=bank.shape[1],
                   images=images, sampled=sampled, layer=layer, sha256=sha256_file(path), norm_range=lengths,
                   home=str(home))
