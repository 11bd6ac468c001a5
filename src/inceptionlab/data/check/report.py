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
        reasons = finding.details.get("reasons", {})
        for item in finding.files[:EXAMPLES]:
            reason = f": {reasons[item]}" if isinstance(item, str) and item in reasons else ""
            lines.append(f"           {_example(item)}{reason}")
        if len(finding.files) > EXAMPLES:
            lines.append(f"           ... and {len(finding.files) - EXAMPLES} more (--json lists all)")
        weights, counts = finding.details.get("weights"), finding.details.get("counts", {})
        if weights:
            shown = sorted(weights.items(), key=lambda kv: -kv[1])
            for name, weight in shown[:EXAMPLES]:
                n = counts.get(name, "?")
                lines.append(f"           {name}: {n} image{'' if n == 1 else 's'}, weight {weight:g}")
            if len(shown) > EXAMPLES:
                lines.append(f"           ... and {len(shown) - EXAMPLES} more classes (--json lists all)")
    return "\n".join(lines)
