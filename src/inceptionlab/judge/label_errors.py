"""Likely label errors: images whose given class the model's held-out probabilities contradict.

Ranked by confident learning (Northcutt et al. 2021) with cleanlab's `find_label_issues`, from the
per-image results table (judge/results.py): no model is run. The probabilities must be held out (the
validation split of a run, whose images the model never trained on); on the training split the model
has memorised the labels, wrong ones included, and few errors are found.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from inceptionlab.errors import UserError
from inceptionlab.judge.results import Results


def _cleanlab_filter() -> Any:
    """cleanlab.filter, imported on first use (it imports scikit-learn and pandas: seconds)."""
    try:
        import cleanlab.filter  # seconds (scikit-learn, pandas); only the label check needs it
    except ImportError:
        raise UserError("the label-error check needs cleanlab: pip install 'inceptionlab[trust]' "
                        "(or pip install cleanlab)") from None
    return cleanlab.filter


@dataclass
class LabelIssue:
    row: int  # the results table's row
    given: int  # the class the data gives (model output index)
    suggested: int  # the model's most probable class among the classes present
    self_confidence: float  # the model's probability of the given class (cleanlab's ranking score)
    suggested_prob: float

    def as_dict(self, results: Results) -> dict[str, Any]:
        labels = results.labels
        return {"row": self.row, "file": results.rows[self.row]["file"], "given": labels[self.given],
                "suggested": labels[self.suggested], "self_confidence": round(self.self_confidence, 6),
                "suggested_prob": round(self.suggested_prob, 6)}


def held_out(results: Results) -> bool:
    """False when the table holds images the model trained on: its training split, all of a run's own data
    (`--split all`), or other data holding some of its training files (`evaluate` records which). Tables
    written before it recorded that: held out unless they score the training split."""
    recorded = results.meta.get("held_out")
    return bool(recorded) if recorded is not None else results.meta.get("split") != results.meta.get("train_split")


def likely_label_errors(results: Results, temperature: float = 1.0) -> list[LabelIssue]:
    """The rows cleanlab flags, most likely first (lowest probability of the given label).

    Only the classes with samples in the table take part: a 1000-class ImageNet model scored on 200
    classes has its probabilities renormalised over those 200, since confident learning estimates how
    often each given class is really another one, which it can only do for classes that occur.
    """
    if len(results.rows) == 0:
        return []
    given = results.targets
    present = np.unique(given)
    if len(present) < 2:
        return []  # one class: nothing to confuse it with
    probs = results.probabilities(temperature)[:, present]
    probs = probs / probs.sum(axis=1, keepdims=True)
    dense = np.searchsorted(present, given)  # cleanlab wants labels 0..K-1
    _require_better_than_chance(dense, probs.argmax(axis=1))
    ranked = _cleanlab_filter().find_label_issues(dense, probs, return_indices_ranked_by="self_confidence")
    issues = []
    for row in map(int, ranked):
        best = int(probs[row].argmax())
        issues.append(LabelIssue(row, int(given[row]), int(present[best]), float(probs[row, dense[row]]),
                                 float(probs[row, best])))
    return issues


def _require_better_than_chance(given: np.ndarray, predicted: np.ndarray) -> None:
    """Refuse (UserError, saying why) a model whose answers the images cannot tell from chance.

    Confident learning trusts the model where it contradicts a label. A model that answers one class for
    everything (an early or broken run) contradicts nearly every other image: cleanlab flagged 17 of 23
    held-out images of a 2-epoch from-scratch Inception v3 as label errors, all of them the model's own.
    The bar is the mean per-class recall (balanced accuracy: a constant answer scores 1/K however
    imbalanced the classes) above chance, 1/K, by two standard errors of what guessing at random would
    score on these per-class counts: (1/K) * sqrt(sum_c (1/K)(1 - 1/K) / n_c). 23 images of 4 classes
    need 0.475; 50 validation images per class of tiny-imagenet's 200 need 0.0064.
    """
    classes, counts = np.unique(given, return_counts=True)
    recall = float(np.mean([np.mean(predicted[given == c] == c) for c in classes]))
    chance = 1.0 / len(classes)
    bar = chance + 2.0 * chance * float(np.sqrt(np.sum(chance * (1.0 - chance) / counts)))
    if recall <= bar:
        raise UserError(f"the model's mean per-class recall {recall:.3f} on these {len(given)} images is not clearly "
                        f"above chance ({chance:.3f} for {len(classes)} classes; needs more than {bar:.3f}): its "
                        "errors would be taken for label errors; train further, or evaluate a better model")
