"""`evaluate --unknown coverage=C`: fit the kNN unknown detector (models/knn.py) on the run's own validation
split, and measure it beside the two usual scores on images of none of the classes.

The bank is the run's training split's penultimate features, in the eval view (the spec's resize and
centre crop), through the frozen-feature cache's extraction and cache (engine/features.py): a second
evaluation of the same weights reads them from the cache. The threshold is the distance within which a
share C of the validation images lie (judge/calibrate.py's `choose_threshold` on minus the distance,
halfway between the two validation scores it separates).

With --unknown-images the three scores are compared on the same images, each thresholded for the same
coverage of validation (higher = more in-distribution for all three):

    knn          minus the distance to the k-th nearest training feature (Sun et al. 2022)
    energy       logsumexp of the logits (minus the energy score of Liu et al. 2020, T = 1)
    max_softmax  the calibrated top-1 probability (Hendrycks & Gimpel 2017): what --reject thresholds

AUROC (validation images against the unknown ones) and FPR95 (the share of unknown images answered when
95% of validation is) are threshold-free summaries beside the share answered at the chosen coverage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from scipy.special import logsumexp
from scipy.stats import rankdata

from inceptionlab.engine.features import cache_folder, feature_key, load_or_extract
from inceptionlab.errors import UserError
from inceptionlab.judge.calibrate import RejectTarget, choose_threshold, parse_share
from inceptionlab.models.knn import KnnRule, bank_rows, choose_k, kth_distance, norm_range, normalised, save_bank
from inceptionlab.models.rule import calibrated_probabilities

FPR_COVERAGE = 0.95  # FPR95: the unknown images answered at 95% of validation answered


@dataclass(frozen=True)
class UnknownTarget:
    """What the user asks of the kNN threshold: a share of validation images answered (within it)."""

    coverage: float

    @classmethod
    def parse(cls, text: str) -> "UnknownTarget":
        """'coverage=0.95' (or 95%)."""
        kind, sep, value = text.partition("=")
        if not sep or kind.strip().lower() != "coverage":
            raise UserError(f"--unknown {text!r}: give coverage=C (the share of validation images answered by the "
                            "kNN rule), e.g. --unknown coverage=0.95, or none to drop it")
        return cls(parse_share(f"--unknown {text!r}", "coverage", value))

    def __str__(self) -> str:
        return f"coverage={self.coverage:g}"


# --------------------------------------------------------------------------- the scores


def energy_score(logits: Any) -> np.ndarray:
    """logsumexp of the logits (float64): minus the energy; higher is more in-distribution."""
    return logsumexp(np.asarray(logits, dtype=np.float64), axis=1)


def max_softmax(logits: Any, temperature: float = 1.0) -> np.ndarray:
    return calibrated_probabilities(logits, temperature).max(axis=1)


def auroc(inside: np.ndarray, outside: np.ndarray) -> float:
    """The probability that an in-distribution image scores above an unknown one (ties count half): the
    Mann-Whitney statistic over both sets' ranks."""
    inside, outside = np.asarray(inside, np.float64), np.asarray(outside, np.float64)
    ranks = rankdata(np.concatenate([inside, outside]))
    n_in, n_out = len(inside), len(outside)
    return float((ranks[:n_in].sum() - n_in * (n_in + 1) / 2) / (n_in * n_out))


def coverage_threshold(inside: np.ndarray, coverage: float) -> float:
    """The score at or above which a share `coverage` of the in-distribution images lie (calibrate's
    halfway rule, so no image sits on it)."""
    inside = np.asarray(inside, np.float64)
    floor = float(inside.min()) - 1.0
    return choose_threshold(inside, np.ones(len(inside)), RejectTarget("coverage", coverage), floor=floor).threshold


def fpr_at(inside: np.ndarray, outside: np.ndarray, coverage: float = FPR_COVERAGE) -> float:
    """The share of unknown images scored at or above the lowest of the `coverage` highest in-distribution
    scores: the ROC curve's false-positive rate at true-positive rate `coverage` (FPR95 at 0.95), as
    sklearn's roc_curve gives it (the threshold at an inside score, not halfway as a saved rule's is)."""
    inside = np.sort(np.asarray(inside, np.float64))[::-1]
    cut = inside[max(math.ceil(coverage * len(inside) - 1e-9), 1) - 1]
    return float((np.asarray(outside) >= cut).mean())


SCORES = ("knn", "energy", "max_softmax")


def scores_of(logits: np.ndarray, features: np.ndarray | None, rule: Any) -> dict[str, np.ndarray]:
    """The three scores (higher = more in-distribution) of these images under `rule` (knn needs its bank)."""
    out = {"energy": energy_score(logits), "max_softmax": max_softmax(logits, rule.temperature)}
    if rule.knn is not None and features is not None:
        out["knn"] = -rule.knn.distances(features)
    return out


def compare_scores(inside: dict[str, np.ndarray], outside: dict[str, np.ndarray], coverage: float) -> dict[str, Any]:
    """Per score: the share of unknown images answered `unknown` at `coverage` of validation answered, AUROC
    and FPR95, side by side."""
    table = {}
    for name in SCORES:
        if name not in inside:
            continue
        threshold = coverage_threshold(inside[name], coverage)
        table[name] = {"unknown_share": float((outside[name] < threshold).mean()),
                       "auroc": auroc(inside[name], outside[name]), "fpr95": fpr_at(inside[name], outside[name]),
                       "threshold": threshold}
    return table


def comparison_lines(comparison: dict[str, Any], coverage: float, images: int) -> list[str]:
    """The side-by-side table evaluate prints."""
    lines = [f"unknown detection on {images} images of none of the classes, each score thresholded for "
             f"{coverage:.0%} of validation answered:",
             f"  {'score':<12} {'unknown':>8} {'AUROC':>7} {'FPR95':>7}"]
    for name, row in comparison.items():
        lines.append(f"  {name:<12} {row['unknown_share']:>8.1%} {row['auroc']:>7.3f} {row['fpr95']:>7.3f}")
    return lines


# --------------------------------------------------------------------------- the bank


@dataclass
class Bank:
    features: torch.Tensor  # (rows, D) as extracted (normalised when saved)
    images: int  # training images they were drawn from
    sampled: str  # "all" or how the rows were drawn
    cached: Path | None
    loaded: bool  # read from the feature cache


def bank_features(layer: str, dataset: Any, key_parts: dict[str, Any],
                  extract: Callable[[], tuple[torch.Tensor, torch.Tensor]], class_names: list[str]) -> Bank:
    """The training split's features: from the feature cache, or extracted and cached (`extract`), then
    subsampled to models/knn.py's MAX_BANK_BYTES where larger."""
    key = feature_key({**key_parts, "head": layer, "split": "train"}, dataset)
    folder = cache_folder(dataset)
    split, loaded, _ = load_or_extract(key, folder, extract, class_names)
    features = split.inputs.float()
    count, dim = features.shape
    if count == 0:
        raise UserError("the training split has no readable images: no kNN bank to fit on")
    rows = bank_rows(count, dim)
    if rows is None:
        return Bank(features, count, "all", folder, loaded)
    return Bank(features[torch.from_numpy(rows)], count, f"a seeded random {len(rows):,}", folder, loaded)


def fit_knn(bank: Bank, val_features: np.ndarray, target: UnknownTarget, layer: str, home: Path,
            classes: int) -> KnnRule:
    """The bank saved beside model.pt and the distance threshold within which `target.coverage` of the
    validation images lie."""
    if len(val_features) == 0:
        raise UserError("no validation features to fit the kNN threshold on")
    k = choose_k(len(bank.features), classes)
    distances = kth_distance(val_features, normalised(bank.features), k)
    threshold = -coverage_threshold(-distances, target.coverage)
    return save_bank(bank.features, home, images=bank.images, sampled=bank.sampled, layer=layer, k=k,
                     threshold=max(threshold, 0.0), target=str(target), lengths=norm_range(bank.features, val_features))


def knn_line(knn: KnnRule, val_distances: np.ndarray, bank: Bank | None) -> str:
    """What evaluate prints of the detector: its threshold, the validation share within it, and the bank."""
    within = float((~knn.far(val_distances)).mean()) if len(val_distances) else math.nan
    source = "" if bank is None else (f"; features read from the cache {bank.cached}" if bank.loaded else
                                      f"; features cached in {bank.cached}")
    return (f"kNN unknown detector: {knn.describe()}; {within:.1%} of validation within it; bank saved to "
            f"{knn.path}{source}")
