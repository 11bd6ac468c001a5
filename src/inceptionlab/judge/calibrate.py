"""Calibrated scores and "unknown": temperature scaling, expected calibration error, a reject threshold.

Everything here takes validation **logits** and labels (numpy, (N, C); a binary model's one logit z
as the two logits [0, z], whose softmax is [1 - sigmoid(z), sigmoid(z)]): the per-image results table's
(judge/results.py, `evaluate`'s eval/logits.npy), whether in memory right after `evaluate` scored them
or read back with `read_results`.

- `fit_temperature`: the T that minimises the negative log-likelihood of softmax(logits / T) (Guo
  et al., 2017). Fitted on logits, never on probabilities: a "temperature" applied to softmax outputs
  is not temperature scaling and makes calibration worse (gpleiss/temperature_scaling #29). The NLL
  is convex in 1/T, so a safeguarded Newton search on 1/T finds the one minimum exactly.
- `calibration_error`: ECE over equal-width confidence bins (15, as Guo et al.), with the bins
  themselves for a reliability diagram.
- `choose_threshold`: the lowest calibrated top-1 probability to answer with, chosen on validation
  for the precision (accuracy of the answers given) or the coverage (share of images answered) the
  user names; below it the answer is "unknown".

Applying the rule (calibrated probabilities, the "unknown" answer) is models/rule.py's: predict, export
and serve need it without judging anything.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from inceptionlab.errors import UserError
from inceptionlab.models.rule import softmax

ECE_BINS = 15  # Guo et al.'s reliability diagrams and ECE
# 1/T is searched in [BETA_MIN, BETA_MAX]: T from 0.01 (logits 100x too timid) to 1000 (a model whose
# scores say nothing, fitted to the uniform answer). Outside that the data, not the model, is odd.
BETA_MIN, BETA_MAX = 1e-3, 100.0
TARGETS = ("precision", "coverage")


def _check(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    logits = np.asarray(logits, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    if logits.ndim != 2 or logits.shape[1] < 2:
        raise ValueError(f"logits must be (N, C) with C >= 2 (binary as [0, z]); got shape {logits.shape}")
    if len(logits) != len(labels):
        raise ValueError(f"{len(logits)} logit rows for {len(labels)} labels")
    if len(labels) and (labels.min() < 0 or labels.max() >= logits.shape[1]):
        raise ValueError(f"labels outside 0..{logits.shape[1] - 1}")
    return logits, labels


def nll(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of softmax(logits / T) at the true labels."""
    return float(np.mean(per_image_nll(logits, labels, temperature)))


def per_image_nll(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Each image's negative log-likelihood of softmax(logits / T) at its true label."""
    logits, labels = _check(logits, labels)
    scaled = logits / temperature
    top = scaled.max(axis=1)
    log_norm = top + np.log(np.exp(scaled - top[:, None]).sum(axis=1))
    return log_norm - scaled[np.arange(len(labels)), labels]


def _nll_slope(logits: np.ndarray, labels: np.ndarray, beta: float) -> tuple[float, float]:
    """d/dbeta and d2/dbeta2 of the NLL of softmax(beta * logits): mean(E_p[z] - z_y) and mean(Var_p[z])."""
    p = softmax(logits, 1.0 / beta)
    expected = (p * logits).sum(axis=1)
    variance = (p * logits**2).sum(axis=1) - expected**2
    true = logits[np.arange(len(labels)), labels]
    return float(np.mean(expected - true)), float(np.mean(np.maximum(variance, 0.0)))


def fit_temperature(logits: np.ndarray, labels: np.ndarray, tol: float = 1e-10) -> float:
    """The temperature T > 0 minimising the NLL of softmax(logits / T) over the given samples.

    The NLL is convex in beta = 1/T (its second derivative is the mean variance of the logits under
    the model's own probabilities), so its slope crosses zero once: bracket the crossing, then Newton
    steps, falling back to bisection when a step would leave the bracket.
    """
    logits, labels = _check(logits, labels)
    if len(labels) == 0:
        raise UserError("no samples to fit a temperature on")
    slope = lambda beta: _nll_slope(logits, labels, beta)  # noqa: E731
    low, high = BETA_MIN, 1.0
    if slope(low)[0] >= 0:  # no better than chance even at T = 1000: the uniform answer is the best fit
        return 1.0 / BETA_MIN
    while slope(high)[0] < 0:
        low, high = high, high * 2
        if high > BETA_MAX:  # still sharpening at T = 0.01: every sample right with a margin, say so by T
            return 1.0 / BETA_MAX
    beta = 1.0 if low < 1.0 < high else (low + high) / 2
    for _ in range(100):
        grad, curvature = slope(beta)
        if abs(grad) < tol:  # at the minimum: stop here (a bisection step now would leave it)
            break
        if grad < 0:
            low = beta
        else:
            high = beta
        step = beta - grad / curvature if curvature > 0 else None
        # A Newton step that rounds onto the bracket's edge is the converged answer, not an escape.
        beta = step if step is not None and low <= step <= high else (low + high) / 2
        if high - low < tol * high:
            break
    return 1.0 / beta


@dataclass
class Reliability:
    """ECE and the equal-width bins it is the weighted mean gap of (a reliability diagram's bars)."""

    ece: float
    bins: list[dict[str, float]]  # lower, upper, count, confidence (mean), accuracy

    def to_dict(self) -> dict[str, Any]:
        return {"ece": self.ece, "bins": self.bins}


def calibration_error(confidences: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> Reliability:
    """Expected calibration error: sum over bins (lo, hi] of |accuracy - mean confidence| x share of samples."""
    confidences = np.asarray(confidences, dtype=np.float64).reshape(-1)
    correct = np.asarray(correct, dtype=np.float64).reshape(-1)
    if len(confidences) != len(correct):
        raise ValueError(f"{len(confidences)} confidences for {len(correct)} outcomes")
    index = np.clip(np.ceil(confidences * bins).astype(np.int64) - 1, 0, bins - 1)
    total = max(len(confidences), 1)
    ece, rows = 0.0, []
    for b in range(bins):
        members = index == b
        count = int(members.sum())
        confidence = float(confidences[members].mean()) if count else 0.0
        accuracy = float(correct[members].mean()) if count else 0.0
        ece += count / total * abs(accuracy - confidence)
        rows.append({"lower": b / bins, "upper": (b + 1) / bins, "count": count, "confidence": confidence,
                     "accuracy": accuracy})
    return Reliability(ece, rows)


def top1(logits: np.ndarray, temperature: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(top-1 class, its probability) of softmax(logits / T) per sample."""
    probs = softmax(logits, temperature)
    predicted = probs.argmax(axis=1)
    return predicted, probs[np.arange(len(probs)), predicted]


# --------------------------------------------------------------------------------------- the reject threshold


@dataclass(frozen=True)
class RejectTarget:
    """What the user asks of the threshold: answered images this accurate, or this many answered."""

    kind: str  # precision | coverage
    value: float

    @classmethod
    def parse(cls, text: str) -> "RejectTarget":
        """'precision=0.95' or 'coverage=0.9' (a value in (0, 1], or a percentage such as 95%)."""
        kind, sep, value = text.partition("=")
        kind = kind.strip().lower()
        if not sep or kind not in TARGETS:
            raise UserError(f"--reject {text!r}: give precision=P (answered images at least P accurate) or "
                            "coverage=C (answer at least a share C of images), e.g. precision=0.95")
        try:
            number = float(value.strip().rstrip("%")) / (100 if value.strip().endswith("%") else 1)
        except ValueError:
            raise UserError(f"--reject {text!r}: {value!r} is not a number") from None
        if not 0 < number <= 1:
            raise UserError(f"--reject {text!r}: the {kind} must be in (0, 1], e.g. {kind}=0.95")
        return cls(kind, number)

    def __str__(self) -> str:
        return f"{self.kind}={self.value:g}"


@dataclass
class Threshold:
    threshold: float  # answer when the calibrated top-1 probability is >= this
    precision: float  # accuracy of the answered validation images
    coverage: float  # share of validation images answered
    answered: int
    samples: int
    target: str  # "precision=0.95" / "coverage=0.9" as chosen, or "as saved" (applied, not chosen here)

    def describe(self) -> str:
        where = "these images" if self.target == "as saved" else "validation"
        return (f"unknown below {self.threshold:.4f}: on {where} {self.coverage:.1%} of images answered "
                f"({self.answered}/{self.samples}), {self.precision:.1%} of them right [target {self.target}]")


def selective(confidences: np.ndarray, correct: np.ndarray, threshold: float | None) -> tuple[float, float, int]:
    """(coverage, precision of the answered, number answered) when answering at confidence >= threshold."""
    confidences = np.asarray(confidences, dtype=np.float64).reshape(-1)
    kept = confidences >= threshold if threshold is not None else np.ones(len(confidences), bool)
    answered = int(kept.sum())
    precision = float(np.asarray(correct, dtype=np.float64)[kept].mean()) if answered else float("nan")
    return answered / max(len(confidences), 1), precision, answered


def choose_threshold(confidences: np.ndarray, correct: np.ndarray, target: RejectTarget) -> Threshold:
    """The threshold that meets `target` on these samples while answering as many as it can.

    precision=P: the lowest confidence t such that the images with confidence >= t are at least P
    right (the most answered at that precision). coverage=C: the highest t that still answers at
    least C of the images (the most accurate answers at that coverage). Ties stay together: an image
    is answered or not by its confidence alone.
    """
    confidences = np.asarray(confidences, dtype=np.float64).reshape(-1)
    correct = np.asarray(correct, dtype=np.float64).reshape(-1)
    n = len(confidences)
    if n == 0:
        raise UserError("no validation samples to choose a reject threshold on")
    order = np.argsort(-confidences, kind="stable")
    sorted_conf, hits = confidences[order], np.cumsum(correct[order])
    # The last position of each run of equal confidences: thresholds keep whole runs.
    ends = np.flatnonzero(np.r_[sorted_conf[1:] != sorted_conf[:-1], True])
    kept = ends + 1
    precision = hits[ends] / kept
    if target.kind == "precision":
        meets = np.flatnonzero(precision >= target.value - 1e-12)
        if len(meets) == 0:
            best = int(np.argmax(precision))
            raise UserError(f"no threshold reaches precision {target.value:g} on validation (the best is "
                            f"{precision[best]:.3f}, answering {kept[best]} of {n}); ask for less, e.g. "
                            f"--reject precision={math.floor(precision.max() * 100) / 100:g}")
        pick = int(meets[-1])
    else:
        pick = int(np.flatnonzero(kept >= math.ceil(target.value * n - 1e-9))[0])
    threshold = float(sorted_conf[ends[pick]])
    return Threshold(threshold, float(precision[pick]), float(kept[pick] / n), int(kept[pick]), n, str(target))


# --------------------------------------------------------------------------------------- the whole fit


@dataclass
class Calibration:
    """What `evaluate` reports and saves (eval/calibration.json): before and after temperature scaling."""

    samples: int
    temperature: float
    nll_before: float
    nll_after: float
    before: Reliability
    after: Reliability
    threshold: Threshold | None = None
    fitted: bool = True  # False: the spec's temperature applied, not fitted here (a test split)

    def summary(self) -> dict[str, Any]:
        out = {"samples": self.samples, "temperature": round(self.temperature, 6), "fitted": self.fitted,
               "ece_before": round(self.before.ece, 6), "ece_after": round(self.after.ece, 6),
               "nll_before": round(self.nll_before, 6), "nll_after": round(self.nll_after, 6)}
        if self.threshold is not None:
            out["reject"] = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self.threshold).items()}
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "bins_before": self.before.bins, "bins_after": self.after.bins,
                "bins": ECE_BINS}


def calibrate(logits: np.ndarray, labels: np.ndarray, *, fit: bool = True, temperature: float = 1.0,
              target: RejectTarget | None = None, threshold: float | None = None) -> Calibration:
    """Fit (or apply) the temperature, measure ECE before and after, and choose (or apply) the threshold.

    fit=True (validation): T is fitted here, and `target` picks a new threshold on the calibrated
    scores. fit=False (any other split): the given T and threshold are applied and reported.
    """
    logits, labels = _check(logits, labels)
    if fit:
        temperature = fit_temperature(logits, labels)
    predicted, raw_conf = top1(logits)
    _, conf = top1(logits, temperature)
    correct = predicted == labels
    result = Calibration(len(labels), temperature, nll(logits, labels), nll(logits, labels, temperature),
                         calibration_error(raw_conf, correct), calibration_error(conf, correct), fitted=fit)
    if fit and target is not None:
        result.threshold = choose_threshold(conf, correct, target)
    elif threshold is not None:
        coverage, precision, answered = selective(conf, correct, threshold)
        result.threshold = Threshold(threshold, precision, coverage, answered, len(labels), "as saved")
    return result
