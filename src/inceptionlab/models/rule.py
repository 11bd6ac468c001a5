"""The decision rule: how a model's logits become an answer, one object that travels with the weights.

A rule is test-time augmentation (the views whose logits are averaged: models/tta.py), a temperature
(calibrated probabilities are softmax(logits / T), Guo et al. 2017) and a reject threshold (below it
the answer is "unknown"), with the target the threshold was chosen for and what the rule was fitted
on (`FittedOn`: the run's split and how many images). `evaluate` fits it on the run's own validation
split (judge/decision.py) and saves it in spec.json; every consumer takes it from there (`spec.rule`)
and answers through `decide`: predict (images and texts), HTTP and gRPC serve, /v1/explain, and the
exports' metadata (`parameters`, `to_dict`). None of them assembles the pieces itself.

The score is computed one way everywhere (`calibrated_probabilities`: float64 softmax of the logits
over T, a binary model's one logit z as the two logits [0, z]) and compared one way (`answered`: score
>= threshold), so evaluate's promise ("342 answered") and predict's count on the same images agree:
predict once recomputed the score in float32, which fell below a float64 threshold set at a validation
image's own score, and answered 341. `evaluate` now sets the threshold halfway between the validation
scores it separates (judge/calibrate.py `choose_threshold`), so the last bits of an image's logits,
which differ with the batch it runs in, do not decide it either.

`decide(logits, features=None)` answers a batch: the class, its calibrated probability, whether the
answer is unknown and why. The second reject score, the distance of an image's penultimate features to
the training data's (`knn`: models/knn.py, fitted by `evaluate --unknown coverage=C`), adds its reason
there (FAR, before UNSURE); `needs_features` tells a consumer to pass the features (models/penultimate.py),
and `softmax_only()` is the rule a runtime without them answers by (an exported graph outputs logits).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from inceptionlab.errors import UserError
from inceptionlab.models.knn import FAR, KnnRule
from inceptionlab.models.tta import TTA_VIEWS

UNKNOWN = "unknown"  # the answer when the rule rejects
UNSURE = "unsure"  # why: the calibrated top-1 probability is below the threshold


def two_class(logits: Any) -> np.ndarray:
    """(N, C) logits as float64; a binary model's (N,) or (N, 1) logits z as (N, 2) [0, z], whose softmax is
    [1 - sigmoid(z), sigmoid(z)]. Float32 logits become float64 exactly: nothing is rounded here."""
    if hasattr(logits, "detach"):  # a torch tensor (the package's models): to numpy without importing torch here
        logits = logits.detach().cpu().numpy()
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim == 2 and z.shape[1] > 1:
        return z
    z = z.reshape(-1, 1)
    return np.concatenate([np.zeros_like(z), z], axis=1)


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    scaled = np.asarray(logits, dtype=np.float64) / temperature
    scaled = scaled - scaled.max(axis=1, keepdims=True)
    exp = np.exp(scaled)
    return exp / exp.sum(axis=1, keepdims=True)


def calibrated_probabilities(logits: Any, temperature: float = 1.0) -> np.ndarray:
    """softmax(logits / T) in float64, (N, C): the one way every path computes a score."""
    return softmax(two_class(logits), temperature)


def answered(scores: np.ndarray, threshold: float | None) -> np.ndarray:
    """Which scores the rule answers: those >= the threshold (all of them without one): the one comparison
    evaluate's promise and every consumer's answer make."""
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    return np.ones(len(scores), bool) if threshold is None else scores >= threshold


@dataclass(frozen=True)
class FittedOn:
    """What a rule was fitted on: the run's own validation split, never other data."""

    split: str  # the run's split (its validation split)
    images: int  # how many images the temperature and threshold rest on
    data: str | None = None  # the folder that split was read from

    def describe(self) -> str:
        return f"{self.images} images of {self.split}"


@dataclass(frozen=True)
class Answers:
    """The rule's answers for a batch (`DecisionRule.decide`)."""

    probabilities: np.ndarray  # float64 (N, C), calibrated
    index: np.ndarray  # int64 (N,): the top class
    score: np.ndarray  # float64 (N,): its calibrated probability
    unknown: np.ndarray  # bool (N,)
    reason: tuple[str | None, ...]  # why each unknown one is (FAR, UNSURE); None where answered
    distance: np.ndarray | None = None  # float64 (N,): the kNN distance, where the rule has a bank

    def __len__(self) -> int:
        return len(self.index)

    def row(self, i: int, labels: Sequence[str]) -> dict[str, Any]:
        """One input's answer as predict --json and /v1/classify give it: the top label or "unknown", the
        calibrated top-1 probability as its score, and whether the rule rejected it; under a rule with a kNN
        bank also why (`reason`: FAR, UNSURE or None) and the distance (a rule without one answers as before)."""
        unknown = bool(self.unknown[i])
        row = {"answer": UNKNOWN if unknown else labels[int(self.index[i])],
               "score": round(float(self.score[i]), 6), "unknown": unknown}
        if self.distance is not None:  # a rule with a kNN bank: why an answer is unknown, and the distance
            row["reason"] = self.reason[i]
            row["knn_distance"] = round(float(self.distance[i]), 6)
        return row


@dataclass(frozen=True)
class DecisionRule:
    """Test-time augmentation, temperature and reject threshold, with their target and what they were fitted on,
    and the kNN unknown detector on the features where `evaluate --unknown` fitted one."""

    tta: str = "none"  # none | flip | crops | flip-crops: the views whose logits are averaged
    temperature: float = 1.0  # calibrated probabilities: softmax(logits / temperature)
    threshold: float | None = None  # calibrated top-1 probability below which the answer is "unknown"
    target: str | None = None  # what the threshold was chosen for on validation, e.g. "precision=0.95"
    fitted_on: FittedOn | None = None  # None: never fitted (T = 1, no threshold), or fitted before this was recorded
    knn: KnnRule | None = None  # the unknown detector on the features (models/knn.py); None: softmax rule only

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0):
            raise ValueError(f"rule temperature {self.temperature!r} must be > 0")
        if self.threshold is not None and not 0 <= self.threshold <= 1:
            raise ValueError(f"rule threshold {self.threshold!r} must be in [0, 1]")
        if self.tta not in TTA_VIEWS:
            raise ValueError(f"rule tta {self.tta!r} is not one of {', '.join(TTA_VIEWS)}")

    # ------------------------------------------------------------------ what it is

    @property
    def fitted(self) -> bool:
        """Fitted by `evaluate`: its temperature and threshold mean something only under its own tta. A rule
        saved before `fitted_on` was recorded counts as fitted when it changed anything."""
        return (self.fitted_on is not None or self.temperature != 1.0 or self.threshold is not None
                or self.knn is not None)

    @property
    def rejects(self) -> bool:
        """Whether any input can be answered "unknown" (serve's `unknown` output exists then)."""
        return self.threshold is not None or self.knn is not None

    @property
    def needs_features(self) -> bool:
        """Whether `decide` needs the inputs' penultimate features besides their logits (a kNN bank)."""
        return self.knn is not None

    def softmax_only(self) -> "DecisionRule":
        """The rule without its kNN detector: what a runtime answers by that has the logits alone."""
        return dataclasses.replace(self, knn=None)

    def located(self, home: Any) -> "DecisionRule":
        """The rule with its bank's file found in `home` (the run directory spec.json was read from)."""
        return dataclasses.replace(self, knn=self.knn.located(home)) if self.knn else self

    def under(self, tta: str | None, where: str = "the model") -> "DecisionRule":
        """The rule a command applies when asked for `tta` (None: the rule's own). A rule never fitted takes
        any mode; a fitted one is refused another: its temperature and threshold were fitted on logits
        averaged over its own views, and mean something else on others'. Refitting is `evaluate`'s (it
        needs the run's validation split, and changes the rule every later command answers by)."""
        if tta is None or tta == self.tta:
            return self
        if not self.fitted:
            return dataclasses.replace(self, tta=tta)
        fitted = f" on {self.fitted_on.describe()}" if self.fitted_on else ""
        raise UserError(f"--tta {tta}: the decision rule of {where} ({self.describe()}) was fitted{fitted} with "
                        f"test-time augmentation {self.tta}, and its temperature and threshold mean something "
                        f"else under {tta}; drop --tta to answer by it, or fit it anew: inceptionlab evaluate "
                        f"{where} --tta {tta}")

    # ------------------------------------------------------------------ applying it

    def probabilities(self, logits: Any) -> np.ndarray:
        """Calibrated probabilities, float64 (N, C) (a binary model's as [1 - p, p])."""
        return calibrated_probabilities(logits, self.temperature)

    def decide(self, logits: Any, features: Any = None) -> Answers:
        """The answers for a batch of logits (averaged over the rule's views already: the caller runs the
        model with them) and, for a rule with a kNN bank, the same inputs' penultimate features (averaged
        over the same views). Far from the training data is said before unsure."""
        probs = self.probabilities(logits)
        index = probs.argmax(axis=1) if probs.size else np.zeros(0, np.int64)
        score = probs[np.arange(len(probs)), index]
        unsure = ~answered(score, self.threshold)
        distance, far = None, np.zeros(len(score), bool)
        if self.knn is not None:
            if features is None:
                raise ValueError("this decision rule has a kNN bank: decide() needs the inputs' features "
                                 "(or answer by rule.softmax_only())")
            distance = self.knn.distances(features)
            far = self.knn.far(distance)
        reason = tuple(FAR if f else UNSURE if u else None for f, u in zip(far, unsure))
        return Answers(probs, index, score, unsure | far, reason, distance)

    # ------------------------------------------------------------------ saying it

    def describe(self) -> str:
        parts = [f"temperature {self.temperature:.4g}" if self.temperature != 1.0 else "uncalibrated (T = 1)"]
        if self.threshold is not None:
            parts.append(f"unknown below {self.threshold:.4f}" + (f" [{self.target}]" if self.target else ""))
        if self.knn is not None:
            parts.append(self.knn.describe())
        if self.tta != "none":
            parts.append(f"test-time augmentation {self.tta}")
        return ", ".join(parts)

    def parameters(self) -> list[tuple[str, str]]:
        """The rule as configuration parameters (the server's model configuration, an exported Triton
        config): how `probabilities` are calibrated from `logits`, and when the answer is "unknown".
        Numbers are written in full (repr), so a client reproduces the comparison to the bit."""
        rule = [("temperature", repr(float(self.temperature))), ("tta", self.tta)]
        if self.threshold is not None:
            rule += [("reject_threshold", repr(float(self.threshold))), ("reject_target", self.target or "")]
        if self.fitted_on is not None:
            rule.append(("rule_fitted_on", self.fitted_on.describe()))
        if self.knn is not None:
            rule += [("knn_threshold", repr(float(self.knn.threshold))), ("knn_k", str(self.knn.k)),
                     ("knn_target", self.knn.target), ("knn_bank", f"{self.knn.file} ({self.knn.rows} x {self.knn.dim})"),
                     ("knn_without_bank", WITHOUT_BANK)]
        return rule

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.knn is None:
            del out["knn"]  # a rule without a bank is saved as before it could have one (exports stay current)
        else:
            out["knn"] = self.knn.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DecisionRule":
        fitted, knn = data.get("fitted_on"), data.get("knn")
        return cls(**{**data, "fitted_on": FittedOn(**fitted) if fitted else None,
                      "knn": KnnRule(**knn) if knn else None})

    @classmethod
    def from_legacy(cls, data: dict[str, Any]) -> "DecisionRule":
        """The rule of a spec.json written before the rule was one object (flat keys, popped from `data`)."""
        return cls(tta=data.pop("tta", "none"), temperature=data.pop("temperature", 1.0),
                   threshold=data.pop("reject_threshold", None), target=data.pop("reject_target", None))


# What an exported graph's runtime gets of a rule with a kNN bank (its metadata says it): the graph outputs
# logits, not features, and the bank stays in the run directory.
WITHOUT_BANK = ("the kNN detector needs the model's penultimate features and the bank file, which an exported graph "
                "(ONNX, Triton) does not carry: a runtime of the export answers by the softmax rule only (temperature "
                "and reject threshold); inceptionlab predict and serve on the run directory apply both")

LEGACY_KEYS = ("tta", "temperature", "reject_threshold", "reject_target")
