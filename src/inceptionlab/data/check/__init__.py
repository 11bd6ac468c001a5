"""A health check of the user's data, read the way training reads it (`inceptionlab data check DIR`).

    report = check_data(Path("data/flowers"))            # every check: decodes and hashes every file
    findings = quick_check(Path("data/flowers"))         # the cheap part `train` runs first: no decoding

listing.py says which files belong to which split and class; scan.py reads each file once (in a
process pool, JPEGs drafted down); checks.py turns both into findings, each naming its files and what
to do; report.py prints them (or `--json`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from inceptionlab.data.check.checks import (
    SEVERITIES,
    Finding,
    Where,
    blank_findings,
    copy_findings,
    count_findings,
    decode_findings,
    image_findings,
    layout_findings,
    per_class,
    relative,
)
from inceptionlab.data.check.listing import DataListing, list_dataset
from inceptionlab.data.check.scan import hashes_available, scan_files
from inceptionlab.hardware import usable_cpus  # the one place that knows the CPUs this process may use

__all__ = ["DataReport", "Finding", "check_data", "quick_check", "warning_line"]

CHECK_EXTRA = "pip install 'inceptionlab[check]'"


@dataclass
class DataReport:
    root: Path
    layout: str
    splits: dict[str, dict[str, Any]]  # name -> images, classes, per_class
    findings: list[Finding]
    images: int
    seconds: float
    near_copies_checked: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0

    def counts(self) -> dict[str, int]:
        return {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES}

    def to_dict(self) -> dict[str, Any]:
        return {"root": str(self.root), "layout": self.layout, "splits": self.splits, "images": self.images,
                "seconds": round(self.seconds, 3), "images_per_s": round(self.images_per_s, 1),
                "near_copies_checked": self.near_copies_checked, "counts": self.counts(), "notes": self.notes,
                "findings": [f.to_dict() for f in self.findings]}


def _split_summary(listing: DataListing) -> dict[str, dict[str, Any]]:
    return {s.name: {"images": len(s.samples), "classes": len(s.classes), "per_class": per_class(s)}
            for s in listing.splits}


def _ordered(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))


def check_data(root: Path, labels_csv: Path | None = None, workers: int | None = None,
               progress: Callable[[int, int], Any] | None = None) -> DataReport:
    """Every check. `progress(done, total)` is called as files are scanned; `workers` processes scan
    them (default: the CPUs this process may use)."""
    started = time.perf_counter()
    listing = list_dataset(Path(root), labels_csv)
    paths = [path for split in listing.splits for path, _ in split.samples]
    where = [Where(split.name, split.classes[label] if split.classes and label >= 0 else None)
             for split in listing.splits for _, label in split.samples]
    near = hashes_available()
    done = [0]

    def tick(count: int) -> None:
        done[0] += count
        if progress is not None:
            progress(done[0], len(paths))

    facts = scan_files(paths, usable_cpus() if workers is None else workers, tick, hashes=near)
    base = listing.root
    findings = layout_findings(listing) + count_findings(listing) + decode_findings(facts, base)
    findings += copy_findings(facts, where, base, near) + blank_findings(facts, base) + image_findings(facts, base)
    notes = list(listing.notes)
    if not near:
        notes.append(f"near copies were not looked for: imagehash is not installed ({CHECK_EXTRA})")
    return DataReport(base, listing.layout, _split_summary(listing), _ordered(findings), len(paths),
                      time.perf_counter() - started, near, notes)


def quick_check(root: Path, labels_csv: Path | None = None) -> list[Finding]:
    """The checks that need no decoding (folders, classes, counts, empty files): `train` runs these first."""
    listing = list_dataset(Path(root), labels_csv)
    findings = layout_findings(listing) + count_findings(listing)
    empty = [path for split in listing.splits for path, _ in split.samples if _size(path) == 0]
    if empty:
        findings.append(Finding("undecodable", "error", f"{len(empty)} empty file(s) (0 bytes)",
                                "delete them or copy them again: they hold no image",
                                [relative(p, listing.root) for p in empty]))
    return _ordered(findings)


def _size(path: str) -> int | None:
    try:
        return Path(path).stat().st_size
    except OSError:  # a broken link: the full check names it with its reason
        return None


def warning_line(findings: list[Finding], root: Path) -> str | None:
    """One line for `train` when something is wrong (errors and warnings), else None."""
    shown = [f for f in findings if f.severity in ("error", "warning")]
    if not shown:
        return None
    first = "; ".join(f.message for f in shown[:2]) + ("; ..." if len(shown) > 2 else "")
    return f"warning: data check: {first} (details and what to do: inceptionlab data check {root})"
