"""`inceptionlab evaluate`: loss, top-1, top-5, per-class accuracy and a confusion matrix."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Optional

import typer

from inceptionlab.cli import options
from inceptionlab.cli.text import display_width, pad
from inceptionlab.errors import UserError


def evaluate(
    run_dir: Optional[Path] = options.run_argument(),
    run: Optional[Path] = options.run_option(),
    model: Optional[str] = options.model_option(),
    weights: Optional[str] = options.weights_option(),
    data: Optional[Path] = typer.Option(None, "--data", help="Dataset folder (default: the run's data.root)."),
    split: Optional[str] = typer.Option(
        None, "--split", help="Split to score (default: the recipe's val split; with --data of a folder of class "
        "folders and no val/, all of it); `all`: every image of the data's class folders."),
    out: Optional[Path] = typer.Option(None, "--out", help="Where to write eval.json, confusion.csv, plots/ and the "
                                       "per-image results.csv + logits.npy (default: RUN/eval)."),
    tta: Optional[str] = options.tta_option("the rule's own (spec.json); on the run's validation split the rule "
                                            "is fitted under it and saved with it; elsewhere a fitted rule refuses "
                                            "another"),
    reject: Optional[str] = typer.Option(
        None, "--reject", metavar="TARGET",
        help="Choose a reject threshold on the validation split: precision=P (the images answered at least P "
             "right) or coverage=C (answer at least a share C of images); below it predict and serve answer "
             "'unknown'. none removes it. Default: keep the saved target, re-chosen on the new calibration."),
    unknown: Optional[str] = typer.Option(
        None, "--unknown", metavar="TARGET",
        help="Fit the unknown detector on the validation split: coverage=C (a share C of validation images lie "
             "within its distance of the training images' features, k-th nearest neighbour); farther, predict "
             "and serve answer 'unknown' (far from the training data). The training features are stored beside "
             "model.pt. none removes it. Default: keep the saved target, refitted on the model as it is."),
    unknown_images: Optional[Path] = typer.Option(
        None, "--unknown-images", metavar="DIR",
        help="Images of none of the classes (noise, another data set): report the share answered 'unknown', and "
             "the kNN distance, energy and max softmax compared there (unknown share, AUROC, FPR95)."),
    keep_rule: bool = typer.Option(False, "--keep-rule", help="Fit nothing and change nothing: report the saved "
                                   "rule on this split (always so on other data and on any split but the run's "
                                   "validation split)."),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress",
                                            help="A progress bar of the batches scored (default: on a terminal)."),
    batch_size: int = options.batch_size_option(64),
    num_workers: Optional[int] = options.num_workers_option(),
    device: str = options.device_option(),
    as_json: bool = options.json_option("one object with loss, top1, top5, per_class, per_class_samples, "
                                        "not_scored (a run's classes without images here), samples, "
                                        "files, calibration (temperature, ECE and NLL before/after, ECE by chance, "
                                        "reject), tta, rule (as fitted or applied, its knn detector), tta_gain, "
                                        "outside_images (with scores: knn, energy, max_softmax), unknown_detector, "
                                        "rule_saved_to, note, skipped (unreadable files and why)"),
) -> None:
    """Score a model on a labelled image split, and calibrate it.

    On the run's own validation split it fits the temperature that calibrates the model's probabilities
    (on its logits) and, with --reject, the threshold below which the answer is 'unknown'; with --unknown,
    the distance to the training images' features (k-th nearest neighbour) beyond which the answer is
    'unknown' too, far from the training data (the bank of features is saved beside model.pt). All are
    saved in the run's spec.json with the test-time augmentation they were fitted under, and predict,
    export and serve answer by them. Any other split, and other data (--data), is scored under the saved rule and
    changes nothing. eval/plots/reliability.png shows the calibration before and after.

    Examples:

      inceptionlab evaluate runs/inception_v3/tiny_imagenet/20261122-101500

      inceptionlab evaluate RUN_DIR --reject precision=0.95 --unknown-images other_photos/

      inceptionlab evaluate RUN_DIR --unknown coverage=0.95 --unknown-images other_photos/

      inceptionlab evaluate RUN_DIR --tta flip          # measure (and adopt) flip test-time augmentation

      inceptionlab evaluate RUN_DIR --split test --json  # the saved rule, reported on the test split

      inceptionlab evaluate --model inception_v3 --data data/tiny-imagenet-200 --json

    Besides the summary it writes one row per image (results.csv, logits.npy): `inceptionlab report`
    turns them into a page of the model's errors.
    """
    # start-up time: torch (~1-2 s) loads when the command runs, never for `inceptionlab --help`
    from inceptionlab.data.io.decode import UnreadableFile
    from inceptionlab.engine.report import skipped_files_note
    from inceptionlab.judge.decision import check_before_scoring, save_calibration
    from inceptionlab.judge.evaluate import evaluate_pretrained, plan_run, save_evaluation, score_run
    from inceptionlab.runtime import resolve_device

    run = options.pick_run(run_dir, run)
    options.pick_source(run, model)
    target = _reject_target(reject)
    dev = resolve_device(device)
    tta = options.check_tta(tta)
    if run is not None:
        plan = plan_run(run, data, split, Path(weights) if weights else None)
        fits = plan.validation and not keep_rule
        check_before_scoring(plan.spec.rule, fits=fits, why_not="--keep-rule" if plan.validation else
                             plan.why_not_validation(), reject=reject, tta=tta, unknown_images=unknown_images,
                             where=str(run), unknown=unknown, input_kind=plan.spec.input_kind)
        knn_target = _unknown_target(unknown, plan.spec.rule) if fits else None
        evaluation = score_run(plan, device=dev, batch_size=batch_size, num_workers=num_workers,
                               tta=tta if fits else plan.spec.rule.under(tta, str(run)).tta, progress=progress,
                               features=knn_target is not None or (plan.spec.rule.knn is not None and not fits))
        out = out or run / "eval"
    else:
        if data is None:
            raise UserError("--model needs --data DIR: class folders named by ImageNet wnid or label")
        fits = not keep_rule
        check_before_scoring(_pretrained_rule(), fits=fits, why_not="--keep-rule", reject=reject, tta=tta,
                             unknown_images=unknown_images, where=model, unknown=unknown, run=False)
        plan, knn_target = None, None
        evaluation = evaluate_pretrained(model, weights or "imagenet", data, device=dev, batch_size=batch_size,
                                         num_workers=num_workers, tta=tta, progress=progress)
        out = out or Path("runs") / "evaluate" / model / time.strftime("%Y%m%d-%H%M%S")
    evaluation, rule = _decision(evaluation, run, fits, target, reject, unknown_images, weights, dev, batch_size,
                                 plan=plan, knn_target=knn_target, num_workers=num_workers)
    paths = save_evaluation(evaluation, out)
    paths.update(save_calibration(rule, out))
    report = {**evaluation.report(), **rule.to_dict()}
    if as_json:
        print(json.dumps({**report, "files": {k: str(v) for k, v in paths.items()}}))
        return
    print(f"scored {evaluation.weights}: {evaluation.weights_note}")
    meta = evaluation.per_image.meta
    _print_table(report, meta["data"] if meta["split"] == "all" else meta["split"])
    print("\n".join(rule.lines()))
    if report["skipped"]:
        skipped = [UnreadableFile(s["file"], s["problem"]) for s in report["skipped"]]
        print(f"{skipped_files_note(skipped)} (not in the {report['samples']} samples)")
    print(f"wrote {paths['json']}, {paths['confusion_csv']}, {paths['confusion_png']}, {paths['reliability_png']}")
    if "results_csv" in paths:
        print(f"per-image results: {paths['results_csv']}; browse the errors: inceptionlab report {out}")


def _reject_target(reject: Optional[str]) -> Any:
    from inceptionlab.judge.calibrate import RejectTarget  # start-up time: torch, as in evaluate()

    return None if reject in (None, "none") else RejectTarget.parse(reject)


def _unknown_target(unknown: Optional[str], saved: Any) -> Any:
    """The kNN target to fit: --unknown's, else the saved rule's (refitted on the model as it is); None for
    none, or where the rule never had one."""
    from inceptionlab.judge.unknown import UnknownTarget  # start-up time: torch, as in evaluate()

    if unknown == "none":
        return None
    if unknown is not None:
        return UnknownTarget.parse(unknown)
    return UnknownTarget.parse(saved.knn.target) if saved.knn is not None else None


def _pretrained_rule() -> Any:
    from inceptionlab.models.rule import DecisionRule  # start-up time: torch, as in evaluate()

    return DecisionRule()  # a pretrained model's: never fitted


def _decision(evaluation: Any, run: Optional[Path], fit: bool, target: Any, reject: Optional[str],
              unknown_images: Optional[Path], weights: Optional[str], device: Any, batch_size: int, *,
              plan: Any = None, knn_target: Any = None, num_workers: Optional[int] = None) -> tuple[Any, Any]:
    """Fit the rule on the run's validation split (saved with a run's model.pt), else apply the saved one;
    then try it on --unknown-images. Returns the evaluation as the rule saw it (without the TTA views
    when they were measured but not adopted: its files then describe the rule saved) and the report."""
    # start-up time: torch, as in evaluate()
    from inceptionlab.judge.decision import (
        RuleReport, adopted, decide, fit_unknown, outside_images, save_rule, tta_gain,
    )
    from inceptionlab.models.registry import load_pretrained_model, load_run_model

    scores = evaluation.scores
    gain = tta_gain(scores)
    chosen, note = adopted(scores, gain) if fit else (scores, None)
    if chosen is not scores:
        evaluation = evaluation.without_tta()
    calibration, rule = decide(chosen, evaluation.spec.rule, fit=fit, target=target, drop_threshold=reject == "none")
    report = RuleReport(calibration, rule, gain, note=note)
    if knn_target is not None and run is not None and not weights:
        knn, report.knn_line = fit_unknown(plan, chosen, knn_target, Path(run), device=device, batch_size=batch_size,
                                           num_workers=num_workers)
        rule = report.rule = dataclasses.replace(rule, knn=knn)
    elif knn_target is not None:
        note = "; ".join(filter(None, [note, "kNN detector not fitted: --weights scored other weights than the "
                                       "run's model.pt"]))
    if rule.rejects:  # the table's rows say which the rule answers unknown, and why
        evaluation.answers = rule.decide(chosen.logits, chosen.features if rule.knn is not None else None)
    if unknown_images is not None:
        if run is not None:
            net, _ = load_run_model(run, Path(weights) if weights else None)
        else:
            net, _ = load_pretrained_model(evaluation.spec.arch, weights or "imagenet")
        report.outside = outside_images(net, dataclasses.replace(evaluation.spec, rule=rule), unknown_images, device,
                                        batch_size, inside=chosen)
    if fit and run is not None and not weights:
        report.saved_to = save_rule(run, evaluation.spec, rule)
    elif fit and run is not None:
        report.note = "; ".join(filter(None, [note, "rule not saved: --weights scored other weights than the "
                                              "run's model.pt"]))
    elif run is not None:
        report.applied_from = Path(run) / "spec.json"
    evaluation.unknown = {key: value for key, value in (("unknown_detector", rule.knn.to_dict() if rule.knn else None),
                                                        ("outside_images", report.outside)) if value is not None}
    return evaluation, report


def _print_table(report: dict, split: str = "val") -> None:
    per_class, counts = report["per_class"], report["per_class_samples"]
    width = max([display_width(k) for k in per_class] + [5])
    print(f"{pad('class', width)}  {'n':>5}  accuracy")
    for label, acc in sorted(per_class.items(), key=lambda kv: (kv[1] is None, kv[1])):
        print(f"{pad(label, width)}  {counts[label]:>5}  {'-' if acc is None else f'{acc:.3f}'}")
    if report.get("not_scored"):
        print(_not_scored_line(report["not_scored"], split))
    top5 = f"  top-5 {report['top5']:.4f}" if "top5" in report else ""
    print(f"\n{report['samples']} samples  loss {report['loss']:.4f}  top-1 {report['top1']:.4f}{top5}")


def _not_scored_line(labels: list[str], split: str) -> str:
    shown = ", ".join(labels[:10]) + (f" and {len(labels) - 10} more" if len(labels) > 10 else "")
    them = "it" if len(labels) == 1 else "them"
    return f"not scored: {shown} (no image of {them} in {split}): {'its' if them == 'it' else 'their'} accuracy is unknown"


def register(root: typer.Typer) -> None:
    root.command("evaluate")(evaluate)
