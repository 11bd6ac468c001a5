"""`inceptionlab report`: the error report of an evaluation, as one HTML page (and --json numbers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from inceptionlab.cli import options


def report(
    path: Path = typer.Argument(..., help="A run directory (its eval/ folder) or a folder evaluate wrote with --out.",
                                show_default=False),
    out: Optional[Path] = typer.Option(None, "--out", help="The HTML file to write (default: report.html beside results.csv)."),
    cam: int = typer.Option(24, "--cam", min=0, help="Grad-CAM overlays for this many misclassified images, "
                            "highest loss first (0: none; runs the model again, the rest of the page does not)."),
    top: int = typer.Option(24, "--top", min=1, help="Images in the top-losses gallery."),
    gallery: int = typer.Option(200, "--gallery", min=0, help="Misclassified images in the gallery (highest loss first)."),
    label_issues: int = typer.Option(50, "--label-issues", min=0,
                                     help="Likely label errors to list (confident learning with cleanlab; 0: skip)."),
    matrix_classes: int = typer.Option(30, "--matrix-classes", min=2,
                                       help="Classes in the confusion matrix (more: those with the most errors)."),
    device: str = options.device_option(),
    as_json: bool = options.json_option("samples, misclassified, top1, loss, per_class (precision, recall, f1), "
                                        "most_confused, top_losses, label_issues, notes, report (the file)"),
) -> None:
    """Browse what the model got wrong, in a page that opens in any browser, offline.
    It shows the top losses, the most-confused pairs, per-class precision and recall, a confusion matrix
    whose cells show their images, the misclassified images (with Grad-CAM), and likely label errors,
    from the per-image results `inceptionlab evaluate` wrote.

    Examples:

      inceptionlab evaluate runs/inception_v3/tiny_imagenet/20261122-101500

      inceptionlab report runs/inception_v3/tiny_imagenet/20261122-101500      # -> .../eval/report.html

      inceptionlab report runs/.../20261122-101500 --cam 0 --json             # numbers only, no model run
    """
    # start-up time: torch (~1-2 s) loads when the command runs, never for `inceptionlab --help`
    from inceptionlab.judge.error_report import REPORT_HTML, ReportSettings, write_report
    from inceptionlab.judge.results import read_results
    from inceptionlab.runtime import resolve_device

    results = read_results(path)
    settings = ReportSettings(top_losses=top, misclassified=gallery, label_issues=label_issues,
                              matrix_classes=matrix_classes, cam=cam)
    target = out or results.folder / REPORT_HTML
    summary = write_report(results, target, settings, device=resolve_device(device) if cam else None)
    if as_json:
        print(json.dumps(summary))
        return
    _print_summary(summary)


def _print_summary(summary: dict) -> None:
    top1 = "-" if summary["top1"] is None else f"{summary['top1']:.4f}"
    print(f"{summary['samples']} images, {summary['misclassified']} misclassified (top-1 {top1})")
    for pair in summary["most_confused"][:5]:
        print(f"  {pair['count']:>4}  {pair['true']} -> {pair['pred']}")
    issues = summary["label_issues"]
    if issues is not None:
        print(f"{len(issues)} likely label error(s)" + (": " + ", ".join(Path(i["file"]).name or str(i["row"])
                                                                         for i in issues[:3]) if issues else ""))
    for note in summary["notes"]:
        print(f"note: {note}")
    print(f"wrote {summary['report']}")


def register(root: typer.Typer) -> None:
    root.command("report")(report)
