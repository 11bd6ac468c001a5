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
- `chance_ece`: the ECE a perfectly calibrated model would show on these images by chance alone (labels
  drawn from its own scores): on a few dozen images ECE over 15 bins is mostly that noise (a
  temperature fitted on 40 images lowered the NLL while ECE rose from 0.078 to 0.092).
- `choose_threshold`: the lowest calibrated top-1 probability to answer with, chosen on validation
  for the precision (accuracy of the answers given) or the coverage (share of images answered) the
  user names; below it the answer is "unknown". Its precision comes with a Wilson interval: on a few
  answered images a measured 100% says little.

The scores are the rule's own (models/rule.py `calibrated_probabilities`, compared by `answered`):
the threshold is chosen at a validation image's score exactly as predict, export and serve compute
it, so they answer the images validation promised.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from inceptionlab.errors import UserError
from inceptionlab.models.rule import answered, calibrated_probabilities, softmax

ECE_BINS = 15  # Guo et al.'s reliability diagrams and ECE
# 1/T is searched in [BETA_MIN, BETA_MAX]: T from 0.01 (logits 100x too timid) to 1000 (a model whose
# scores say nothing, fitted to the uniform answer). Outside that the data, not the model, is odd.
BETA_MIN, BETA_MAX = 1e-3, 100.0
TARGETS = ("precision", "coverage")
# ECE's noise floor: the mean ECE of CHANCE_DRAWS draws of labels from the calibrated scores themselves (a
# perfectly calibrated model); 200 draws put that mean within a few percent. It is said when it reaches
# CHANCE_WORTH_SAYING: the changes of ECE users read (the Fashion-MNIST MLP's 0.020 -> 0.009 at T 1.23)
# are of that size. Chance shrinks as 1/sqrt(images): 0.12 on a small run's 18 validation images, and
# for scores spread evenly over 0.5-1 it is 0.018 on 3,000 images and 0.009 on 12,000, so the line is
# said up to a few thousand images.
CHANCE_DRAWS = 200
CHANCE_WORTH_SAYING = 0.02
WILSON_Z = 1.959964  # 95% two-sided


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
    """(top-1 class, its probability) of softmax(logits / T) per sample: the rule's score, computed as
    predict and serve compute it."""
    probs = calibrated_probabilities(logits, temperature)
    predicted = probs.argmax(axis=1)
    return predicted, probs[np.arange(len(probs)), predicted]


@dataclass
class ChanceECE:
    """The ECE a perfectly calibrated model would show on these images by chance alone."""

    mean: float
    p90: float  # 9 in 10 draws stay below it
    images: int

    def worth_saying(self) -> bool:
        return self.mean >= CHANCE_WORTH_SAYING

    def line(self, measured: float) -> str:
        """What ECE means at this size; `measured`: the calibrated ECE, said to be noise when chance gives as much."""
        line = (f"ECE over {ECE_BINS} bins on {self.images} images: a perfectly calibrated model would show "
                f"{self.mean:.3f} by chance alone (9 in 10 draws below {self.p90:.3f})")
        if measured <= self.p90:
            line += (f"; {measured:.3f} is within that noise, and the NLL, to which every image contributes, is the "
                     "fit's measure at this size")
        return line

    def to_dict(self) -> dict[str, float]:
        return {"mean": round(self.mean, 6), "p90": round(self.p90, 6), "draws": CHANCE_DRAWS}


def chance_ece(confidences: np.ndarray, bins: int = ECE_BINS, draws: int = CHANCE_DRAWS, seed: int = 0) -> ChanceECE:
    """ECE over `bins` when each image is right with probability equal to its confidence (a perfectly
    calibrated model), by `draws` draws of the labels: the part of a measured ECE that chance alone gives."""
    confidences = np.asarray(confidences, dtype=np.float64).reshape(-1)
    n = len(confidences)
    if n == 0:
        return ChanceECE(0.0, 0.0, 0)
    index = np.clip(np.ceil(confidences * bins).astype(np.int64) - 1, 0, bins - 1)
    members = np.zeros((n, bins), np.float32)
    members[np.arange(n), index] = 1.0
    confidence_sums = confidences @ members  # per bin
    rng = np.random.default_rng(seed)
    step = max(1, 2_000_000 // n)  # draws at a time: ~2 M labels (16 MB of random numbers) in memory
    eces = []
    for start in range(0, draws, step):
        hits = (rng.random((min(step, draws - start), n)) < confidences).astype(np.float32) @ members  # exact counts
        eces.append(np.abs(hits - confidence_sums).sum(axis=1) / n)  # sum_b n_b/n |accuracy_b - confidence_b|
    values = np.concatenate(eces)
    return ChanceECE(float(values.mean()), float(np.quantile(values, 0.9)), n)


def wilson_interval(successes: int, trials: int, z: float = WILSON_Z) -> tuple[float, float]:
    """Wilson's score interval for a proportion (scipy's `binomtest(...).proportion_ci(method="wilson")`)."""
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


# --------------------------------------------------------------------------------------- the reject threshold


def parse_share(where: str, kind: str, value: str) -> float:
    """A share in (0, 1] as an option gives it ('0.95' or '95%'), or a one-line error naming `where`."""
    try:
        number = float(value.strip().rstrip("%")) / (100 if value.strip().endswith("%") else 1)
    except ValueError:
        raise UserError(f"{where}: {value!r} is not a number") from None
    if not 0 < number <= 1:
        raise UserError(f"{where}: the {kind} must be in (0, 1], e.g. {kind}=0.95")
    return number


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
        return cls(kind, parse_share(f"--reject {text!r}", kind, value))

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
    right: int = 0  # answered images that are right (the precision's numerator)

    @property
    def precision_interval(self) -> tuple[float, float]:
        """A 95% interval for the precision, from the answered images alone (Wilson)."""
        return wilson_interval(self.right, self.answered)

    def describe(self) -> str:
        where = "these images" if self.target == "as saved" else "validation"
        low, high = self.precision_interval
        return (f"unknown below {self.threshold:.4f}: on {where} {self.coverage:.1%} of images answered "
                f"({self.answered}/{self.samples}), {self.precision:.1%} of them right (95% interval "
                f"{low:.1%}-{high:.1%} on {self.answered} answered) [target {self.target}]")

    def to_dict(self) -> dict[str, Any]:
        # The threshold in full, as spec.json holds it (a rule's parameter); the measured figures rounded.
        out = {k: (round(v, 6) if isinstance(v, float) and k != "threshold" else v) for k, v in asdict(self).items()}
        out["precision_interval"] = [round(x, 6) for x in self.precision_interval]
        return out


def selective(confidences: np.ndarray, correct: np.ndarray, threshold: float | None) -> tuple[float, float, int]:
    """(coverage, precision of the answered, number answered) when answering by the rule's comparison."""
    confidences = np.asarray(confidences, dtype=np.float64).reshape(-1)
    kept = answered(confidences, threshold)
    count = int(kept.sum())
    precision = float(np.asarray(correct, dtype=np.float64)[kept].mean()) if count else float("nan")
    return count / max(len(confidences), 1), precision, count


def choose_threshold(confidences: np.ndarray, correct: np.ndarray, target: RejectTarget,
                     floor: float = 0.0) -> Threshold:
    """The threshold that meets `target` on these samples while answering as many as it can.

    precision=P: the most images answered (highest first) such that they are at least P right.
    coverage=C: the fewest that still make at least C of the images (the most accurate answers at that
    coverage). Ties stay together: an image is answered or not by its confidence alone.

    The threshold lies halfway between the lowest score answered and the next lower one (or `floor`, the
    lowest top-1 probability there is, 1/C for C classes), not at a validation image's own score: the same
    image's logits differ in their last bits with the batch it is run in (up to 2e-6 on a CPU between
    batches of 1 and 18 of the same images), and a threshold at its score answered or refused it by those
    bits, so evaluate's promise and predict's count could differ by that image.
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
    lowest = ends[pick]
    below = sorted_conf[lowest + 1] if lowest + 1 < n else min(floor, float(sorted_conf[lowest]))
    threshold = float((sorted_conf[lowest] + below) / 2)
    return Threshold(threshold, float(precision[pick]), float(kept[pick] / n), int(kept[pick]), n, str(target),
                     int(round(hits[ends[pick]])))


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
    chance: ChanceECE | None = None  # the ECE chance alone gives at this size, with the calibrated scores

    def summary(self) -> dict[str, Any]:
        out = {"samples": self.samples, "temperature": round(self.temperature, 6), "fitted": self.fitted,
               "ece_before": round(self.before.ece, 6), "ece_after": round(self.after.ece, 6),
               "nll_before": round(self.nll_before, 6), "nll_after": round(self.nll_after, 6)}
        if self.chance is not None:
            out["ece_by_chance"] = self.chance.to_dict()
        if self.threshold is not None:
            out["reject"] = self.threshold.to_dict()
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
                         calibration_error(raw_conf, correct), calibration_error(conf, correct), fitted=fit,
                         chance=chance_ece(conf))
    if fit and target is not None:
        result.threshold = choose_threshold(conf, correct, target, floor=1.0 / logits.shape[1])
    elif threshold is not None:
        coverage, precision, count = selective(conf, correct, threshold)
        right = int(correct[answered(conf, threshold)].sum())
        result.threshold = Threshold(threshold, precision, coverage, count, len(labels), "as saved", right)
    return result
