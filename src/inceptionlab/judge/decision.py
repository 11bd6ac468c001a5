"""`evaluate`'s decision step: fit the rule on the run's own validation split, report it, and save it with the model.

On the validation split (the one a checkpoint is chosen by) `evaluate` fits the temperature on the
logits it has just computed, chooses the reject threshold for the user's target, and writes the rule
(models/rule.py: with the test-time augmentation it was fitted under and what it was fitted on) into
the run's spec.json: from then on `predict`, `export` and `serve` answer by it. On any other split,
and on other data (even with a val/ of its own), it applies the saved rule, reports how it does there
and changes nothing. What an evaluation may do with the rule is checked before any image is scored
(`check_before_scoring`). Either way eval/calibration.json and eval/plots/reliability.png show the
calibration before and after (a reliability diagram: accuracy against confidence per bin).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from inceptionlab.checkpoint import RunDir
from inceptionlab.data.io.image_files import expand_image_paths
from inceptionlab.errors import UserError
from inceptionlab.fileio import atomic_write_json
from inceptionlab.infer.predict import Predictor
from inceptionlab.infer.text import refresh_text_export
from inceptionlab.judge.calibrate import (
    Calibration, RejectTarget, calibrate, calibration_error, nll, per_image_nll, top1,
)
from inceptionlab.judge.evaluate import Scores, training_bank
from inceptionlab.judge.unknown import (
    FPR_COVERAGE, UnknownTarget, compare_scores, comparison_lines, fit_knn, knn_line, scores_of,
)
from inceptionlab.models.knn import FAR, KnnRule
from inceptionlab.models.rule import UNSURE, DecisionRule
from inceptionlab.models.spec import ModelSpec
from inceptionlab.models.tta import views_of

CALIBRATION_JSON = "calibration.json"
RELIABILITY_PNG = "reliability.png"


@dataclass
class RuleReport:
    calibration: Calibration
    rule: DecisionRule  # as fitted here, or as saved (when nothing was fitted)
    tta_gain: dict[str, Any] | None = None
    outside: dict[str, Any] | None = None  # how images of none of the classes were answered
    saved_to: Path | None = None
    note: str | None = None
    applied_from: Path | None = None  # the spec.json whose saved rule scored these images (nothing fitted)
    knn_line: str | None = None  # the kNN detector as fitted here

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"calibration": self.calibration.summary(), "tta": self.rule.tta,
                               "rule": self.rule.to_dict()}
        if self.tta_gain is not None:
            out["tta_gain"] = self.tta_gain
        if self.outside is not None:
            out["outside_images"] = self.outside
        if self.knn_line is not None:
            out["unknown_detector"] = self.knn_line
        out["rule_saved_to"] = str(self.saved_to) if self.saved_to else None
        out["note"] = self.note
        return out

    def lines(self) -> list[str]:
        c = self.calibration
        how = "fitted on these images" if c.fitted else "as saved with the model"
        lines = [f"calibration on {c.samples} images: temperature {c.temperature:.4g} ({how}); "
                 f"ECE {c.before.ece:.4f} -> {c.after.ece:.4f}, NLL {c.nll_before:.4f} -> {c.nll_after:.4f}"]
        if c.chance is not None and c.chance.worth_saying():
            lines.append(c.chance.line(c.after.ece))
        if c.threshold is not None:
            lines.append(c.threshold.describe())
        if self.knn_line:
            lines.append(self.knn_line)
        if self.outside is not None:
            o = self.outside
            why = ", ".join(f"{n} {reason}" for reason, n in o.get("reasons", {}).items())
            lines.append(f"images of none of the classes ({o['folder']}): {o['unknown_share']:.1%} answered unknown "
                         f"({o['unknown']}/{o['images']}{': ' + why if why else ''}), median score "
                         f"{o['median_score']:.3f}")
            if "scores" in o:
                lines.extend(comparison_lines(o["scores"], o["coverage"], o["images"]))
        if self.tta_gain is not None:
            g = self.tta_gain
            lines.append(f"test-time augmentation {g['tta']} ({g['views']} views): top-1 {g['top1_without']:.4f} -> "
                         f"{g['top1_with']:.4f} ({g['top1_gain'] * 100:+.2f} points), NLL {g['nll_without']:.4f} -> "
                         f"{g['nll_with']:.4f}, for {g['views']}x the forward passes")
        if self.note:
            lines.append(self.note)
        if self.saved_to is not None:
            lines.append(f"decision rule saved to {self.saved_to} (predict, export and serve answer by it)")
        elif self.applied_from is not None:
            fitted = f", fitted on {self.rule.fitted_on.describe()}" if self.rule.fitted_on else ""
            lines.append(f"scored under the rule saved in {self.applied_from} ({self.rule.describe()}{fitted}); "
                         "only the run's own validation split fits a rule, so this changed nothing")
        return lines


def check_before_scoring(rule: DecisionRule, *, fits: bool, why_not: str, reject: str | None, tta: str | None,
                         unknown_images: Path | None, where: str, unknown: str | None = None,
                         input_kind: str = "image", run: bool = True) -> None:
    """What an evaluation may do with the rule, refused before any image is scored (one took 6 minutes to
    say --reject did not apply): --reject only where a rule is fitted, another --tta than a fitted rule's
    only where it is fitted anew, and --unknown-images a folder that exists."""
    if reject is not None and not fits:
        raise UserError(f"--reject chooses a threshold on the run's own validation split; this evaluation fits "
                        f"nothing ({why_not}): drop --reject, or score the validation split")
    if unknown is not None and not fits:
        raise UserError(f"--unknown fits the kNN detector on the run's own validation split; this evaluation fits "
                        f"nothing ({why_not}): drop --unknown, or score the validation split")
    if unknown not in (None, "none") and (not run or input_kind != "image"):
        raise UserError("--unknown needs a run's training images for its feature bank: give a run directory of an "
                        "image model" + ("" if run else " (a pretrained model has no training split here)"))
    if not fits:
        rule.under(tta, where)  # another mode than a fitted rule's means nothing here: refused with the fix
    if unknown_images is not None and not Path(unknown_images).exists():
        raise UserError(f"--unknown-images {unknown_images}: not found; give a folder of images of none of the classes")


def decide(scores: Scores, rule: DecisionRule, *, fit: bool, target: RejectTarget | None = None,
           drop_threshold: bool = False) -> tuple[Calibration, DecisionRule]:
    """Fit (fit=True) or apply `rule` on these scores; returns the report and the rule as fitted (or as given).

    When fitting without a new target, a threshold saved earlier is chosen again for its own target on
    the new calibration (the target is what the user asked; the number follows the model).
    """
    if len(scores.targets) == 0:
        raise UserError("no images were scored: nothing to calibrate on")
    if not fit:
        return calibrate(scores.logits, scores.targets, fit=False, temperature=rule.temperature,
                         threshold=None if drop_threshold else rule.threshold), rule
    if target is None and rule.target and not drop_threshold:
        target = RejectTarget.parse(rule.target)
    result = calibrate(scores.logits, scores.targets, fit=True, target=target)
    chosen = result.threshold
    fitted = DecisionRule(tta=scores.tta, temperature=float(result.temperature),
                          threshold=chosen.threshold if chosen else None, target=chosen.target if chosen else None,
                          fitted_on=scores.fitted_on)
    return result, fitted


# TTA is adopted when its per-image NLL gain is this many standard errors above zero (paired, on the
# same images): a gain chance gives on a small split would multiply every later forward pass for nothing.
TTA_GAIN_STANDARD_ERRORS = 2.0


def adopted(scores: Scores, gain: dict[str, Any] | None) -> tuple[Scores, str | None]:
    """The scores to fit the rule on: with TTA when it helped on these images beyond their noise (top-1
    not lower, and the per-image NLL lower by more than TTA_GAIN_STANDARD_ERRORS paired standard errors),
    else without it (view 0 of the same pass), with a line saying why."""
    if gain is None:
        return scores, None
    if tta_helped(gain):
        return scores, None
    plain = scores.without_tta()
    if gain["top1_gain"] < 0 or gain["nll_gain"] <= 0:
        why = f"it did not help here (top-1 {gain['top1_without']:.4f} -> {gain['top1_with']:.4f})"
    else:
        spread = gain["nll_gain_se"]
        spread_text = "(one image: no spread)" if spread is None else f"+- {spread:.4f}"
        why = (f"its gain is within the noise of these {gain['images']} images (NLL {gain['nll_without']:.4f} -> "
               f"{gain['nll_with']:.4f}: {gain['nll_gain']:.4f} {spread_text} per image, needs "
               f"{TTA_GAIN_STANDARD_ERRORS:g} standard errors)")
    return plain, f"test-time augmentation {scores.tta} not adopted: {why}; the rule is fitted without it"


def tta_helped(gain: dict[str, Any]) -> bool:
    spread = gain["nll_gain_se"]
    return gain["top1_gain"] >= 0 and spread is not None and gain["nll_gain"] > TTA_GAIN_STANDARD_ERRORS * spread


def tta_gain(scores: Scores) -> dict[str, Any] | None:
    """Top-1 and NLL without TTA (view 0 of the same pass) and with it, on the same images."""
    if scores.plain_logits is None:
        return None
    plain_pred, _ = top1(scores.plain_logits)
    tta_pred, _ = top1(scores.logits)
    without, with_ = float((plain_pred == scores.targets).mean()), float((tta_pred == scores.targets).mean())
    # Paired per-image NLL differences: each image is its own control.
    gains = per_image_nll(scores.plain_logits, scores.targets) - per_image_nll(scores.logits, scores.targets)
    spread = float(gains.std(ddof=1) / np.sqrt(len(gains))) if len(gains) > 1 else None  # one image: no spread
    return {"tta": scores.tta, "views": views_of(scores.tta), "images": int(len(scores.targets)),
            "top1_without": without, "top1_with": with_, "top1_gain": with_ - without,
            "nll_without": nll(scores.plain_logits, scores.targets), "nll_with": nll(scores.logits, scores.targets),
            "nll_gain": float(gains.mean()), "nll_gain_se": spread,
            "ece_without": calibration_error(top1(scores.plain_logits)[1], plain_pred == scores.targets).ece,
            "ece_with": calibration_error(top1(scores.logits)[1], tta_pred == scores.targets).ece}


def outside_images(model: torch.nn.Module, spec: ModelSpec, folder: Path, device: torch.device, batch_size: int,
                   inside: Scores | None = None, coverage: float | None = None) -> dict[str, Any]:
    """How the rule (spec.rule) answers images of none of the model's classes (noise, another data set's
    pictures): the share answered "unknown" is the rejection rate a user can expect on such inputs, with
    the reason of each. With the validation scores (`inside`), the kNN distance, the energy and the max
    softmax are compared on them too, each thresholded for `coverage` of validation answered (default: the
    kNN rule's target, else FPR95's 0.95), with AUROC and FPR95 (judge/unknown.py)."""
    files, errors = expand_image_paths([folder])
    if errors:
        raise UserError(f"--unknown-images {errors[0][0]}: {errors[0][1]}")
    predictor = Predictor(model, spec, device)
    logits, features, count = predictor.score_files(files, batch_size=batch_size)
    if not count:
        raise UserError(f"--unknown-images {folder}: none of its images could be read")
    answers = predictor.rule.decide(logits, features)
    unknown = int(answers.unknown.sum())
    reasons = {why: sum(r == why for r in answers.reason) for why in (FAR, UNSURE)}
    out = {"folder": str(folder), "images": count, "unknown": unknown, "unknown_share": unknown / count,
           "median_score": float(np.median(answers.score)), "threshold": spec.rule.threshold,
           **({"reasons": {why: n for why, n in reasons.items() if n}} if predictor.rule.knn else {})}
    if inside is not None:
        rule = predictor.rule
        if coverage is None:
            coverage = UnknownTarget.parse(rule.knn.target).coverage if rule.knn else FPR_COVERAGE
        outside = scores_of(logits, features, rule)
        out["coverage"] = coverage
        out["scores"] = compare_scores(scores_of(inside.logits, inside.features, rule), outside, coverage)
    return out


def fit_unknown(plan: Any, scores: Scores, target: UnknownTarget, home: Path, *, device: torch.device,
                batch_size: int, num_workers: int | None) -> tuple[KnnRule, str]:
    """The kNN detector fitted on the validation features of `scores` against the run's training bank, and
    the line evaluate prints of it."""
    if scores.features is None:
        raise RuntimeError("the validation pass kept no features for the kNN rule")
    bank, layer = training_bank(plan, device=device, batch_size=batch_size, num_workers=num_workers)
    knn = fit_knn(bank, scores.features, target, layer, home, len(plan.spec.class_names))
    return knn, knn_line(knn, knn.distances(scores.features), bank)


def save_rule(run_dir: Path, spec: ModelSpec, rule: DecisionRule) -> Path:
    """The rule into the run's spec.json (atomically: a reader sees the old spec or the new one), and into
    a text run's export (its meta.json), which answers by it without this package."""
    path = RunDir.open(run_dir).spec_file
    ruled = dataclasses.replace(spec, rule=rule)
    ruled.save(path)
    refresh_text_export(run_dir, ruled)
    return path


def save_calibration(report: RuleReport, out_dir: Path) -> dict[str, Path]:
    """eval/calibration.json (figures and bins) and eval/plots/reliability.png (before and after)."""
    from inceptionlab.plots import plot_reliability  # matplotlib (~0.4 s): only when drawing

    paths = {"calibration_json": out_dir / CALIBRATION_JSON, "reliability_png": out_dir / "plots" / RELIABILITY_PNG}
    atomic_write_json(paths["calibration_json"], {**report.calibration.to_dict(), **report.to_dict()})
    plot_reliability(paths["calibration_json"], paths["reliability_png"])
    return paths
