"""The data check as a person reads it: the splits, then each finding with its files and what to do."""

from __future__ import annotations

from typing import Any

from inceptionlab.data.check import DataReport
from inceptionlab.data.check.checks import EXAMPLES

MARK = {"error": "ERROR  ", "warning": "WARNING", "info": "INFO   "}


def _example(item: Any) -> str:
    return " = ".join(item) if isinstance(item, list) else str(item)


def format_report(report: DataReport) -> str:
    splits = ", ".join(f"{name} {s['images']} images / {s['classes']} classes" for name, s in report.splits.items())
    lines = [f"data check of {report.root} ({report.layout}: {splits})",
             f"  {report.images} files in {report.seconds:.1f} s ({report.images_per_s:.0f} files/s)"]
    lines += [f"  note: {note}" for note in report.notes]
    if not report.findings:
        lines.append("no problems found")
        return "\n".join(lines)
    counts = report.counts()
    lines.append(f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} note(s):")
    for finding in report.findings:
        lines.append(f"{MARK[finding.severity]} {finding.check}: {finding.message}")
        lines.append(f"         what to do: {finding.advice}")
        for item in finding.files[:EXAMPLES]:
            lines.append(f"           {_example(item)}")
        if len(finding.files) > EXAMPLES:
            lines.append(f"           ... and {len(finding.files) - EXAMPLES} more (--json lists all)")
        weights = finding.details.get("weights")
        if weights:
            shown = sorted(weights.items(), key=lambda kv: -kv[1])[:EXAMPLES]
            lines.append("           class weights: " + ", ".join(f"{c} {w:g}" for c, w in shown)
                         + (", ..." if len(weights) > EXAMPLES else ""))
    return "\n".join(lines)
