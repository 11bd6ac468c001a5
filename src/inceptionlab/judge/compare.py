"""Two evaluations of the same images side by side: is B better than A, or could the difference be chance?

`inceptionlab compare A B` reads the per-image results `evaluate` wrote for each (judge/results.py) and
pairs the rows by image. Whether the accuracy differs is judged on the images where the two disagree,
by McNemar's exact test: of the images exactly one of the models gets right, how many go each way. It is
the test Dietterich (1998, "Approximate statistical tests for comparing supervised classification
learning algorithms") recommends for two classifiers scored on one test set. On a few hundred validation
photos, two points of top-1 are often chance: 6 fixed and 2 broken images on 400 (+1 point) give
p = 0.29.

Nothing here runs a model: a run that was never evaluated is refused with the command to run.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inceptionlab.errors import UserError
from inceptionlab.fileio import sha256_file
from inceptionlab.judge.results import Results

ALPHA = 0.05  # the level at which a difference is called one
Z95 = 1.959964  # the normal quantile of a two-sided 95% interval


def mcnemar_exact_p(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value: the chance of a split of the discordant images at least this
    uneven if each were equally likely to go either way (a binomial with p = 1/2)."""
    n, k = only_a + only_b, min(only_a, only_b)
    if n == 0:
        return 1.0
    # log-space terms: exact for any n (math.comb's integers grow to thousands of digits at n ~ 10,000)
    log_half_n = n * math.log(2.0)
    tail = sum(math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - log_half_n)
               for i in range(k + 1))
    return min(1.0, 2.0 * tail)


def _key(row: dict[str, Any]) -> str:
    """An image's identity in a table: its file, or its index in an in-memory split."""
    return row["file"] or f"#{row['sample']}"


def _where(results: Results) -> str:
    meta = results.meta
    return f"{meta.get('split') or '?'} of {meta.get('data') or '?'}"


def _check_same_images(a: Results, b: Results) -> None:
    """In-memory splits (no files) pair by sample index: only meaningful on the same data and split."""
    in_memory = not any(row["file"] for row in a.rows) or not any(row["file"] for row in b.rows)
    if in_memory and (a.meta.get("data"), a.meta.get("split")) != (b.meta.get("data"), b.meta.get("split")):
        raise UserError(f"{a.folder} scored {_where(a)}, {b.folder} scored {_where(b)}: images without files pair "
                        "by their index, so both must score the same split of the same data; evaluate them on one")


@dataclass
class Pairs:
    """The images both tables scored, each as (A's row, B's row), and how many only one scored."""

    rows: list[tuple[dict[str, Any], dict[str, Any]]]
    only_in_a: int
    only_in_b: int


def pair_rows(a: Results, b: Results) -> Pairs:
    _check_same_images(a, b)
    in_b = {_key(row): row for row in b.rows}
    pairs = [(row, in_b[_key(row)]) for row in a.rows if _key(row) in in_b]
    if not pairs:
        raise UserError(f"{a.folder} ({_where(a)}) and {b.folder} ({_where(b)}) scored no image in common: "
                        "evaluate both on the same images (e.g. --data DIR --split val on each)")
    for row_a, row_b in pairs:
        if row_a["true_label"] != row_b["true_label"]:
            raise UserError(f"{_key(row_a)}: labelled {row_a['true_label']!r} in {a.folder} and "
                            f"{row_b['true_label']!r} in {b.folder}: the two evaluations read different labels; "
                            "evaluate both on the same data")
    return Pairs(pairs, len(a.rows) - len(pairs), len(b.rows) - len(pairs))


def per_class_changes(pairs: Pairs) -> list[dict[str, Any]]:
    """Recall of each true class under A and B on the paired images, largest change first."""
    right: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # n, A right, B right
    for row_a, row_b in pairs.rows:
        counts = right[row_a["true_label"]]
        counts[0] += 1
        counts[1] += row_a["correct"]
        counts[2] += row_b["correct"]
    table = [{"label": label, "n": n, "recall_a": round(hits_a / n, 4), "recall_b": round(hits_b / n, 4),
              "change": round((hits_b - hits_a) / n, 4)} for label, (n, hits_a, hits_b) in right.items()]
    return sorted(table, key=lambda r: (-abs(r["change"]), r["label"]))


def verdict(only_a: int, only_b: int, p_value: float, n: int) -> str:
    if only_a + only_b == 0:
        return f"no difference: the two are right and wrong on the same {n} images"
    if p_value < ALPHA:
        better, gained, lost = ("B", only_b, only_a) if only_b > only_a else ("A", only_a, only_b)
        return (f"{better} is better: right on {gained} image(s) the other gets wrong, wrong on {lost} it gets right "
                f"(McNemar p = {p_value:.3g})")
    return (f"no clear difference (McNemar p = {p_value:.3g}): a split of {only_b} to {only_a} disagreements is "
            f"within chance; more validation images would tell")


def stale_note(results: Results) -> str | None:
    """Said when the weights file an evaluation scored has changed since (training resumed into the run,
    or ran again): the table no longer describes the model the run holds."""
    path, recorded = results.meta.get("weights_file"), results.meta.get("weights_sha256")
    if not path or not recorded or not Path(path).is_file() or sha256_file(Path(path)) == recorded:
        return None
    return (f"{results.folder} scored an earlier {path}: the file has changed since; run `inceptionlab evaluate` "
            "on it again to compare the weights it holds now")


def compare(a: Results, b: Results) -> dict[str, Any]:
    """The comparison as `compare --json` prints it."""
    pairs = pair_rows(a, b)
    n = len(pairs.rows)
    right_a = sum(row_a["correct"] for row_a, _ in pairs.rows)
    right_b = sum(row_b["correct"] for _, row_b in pairs.rows)
    fixed = [_key(row_b) for row_a, row_b in pairs.rows if row_b["correct"] and not row_a["correct"]]
    broken = [_key(row_b) for row_a, row_b in pairs.rows if row_a["correct"] and not row_b["correct"]]
    p_value = mcnemar_exact_p(len(broken), len(fixed))
    difference = (len(fixed) - len(broken)) / n
    # Wald interval of a paired difference of proportions (Agresti, Categorical Data Analysis, 10.1)
    spread = Z95 * math.sqrt(max(0.0, (len(fixed) + len(broken)) - n * difference ** 2)) / n
    return {
        "a": str(a.folder), "b": str(b.folder), "samples": n, "only_in_a": pairs.only_in_a,
        "only_in_b": pairs.only_in_b, "top1_a": round(right_a / n, 6), "top1_b": round(right_b / n, 6),
        "difference": round(difference, 6), "ci95": [round(difference - spread, 6), round(difference + spread, 6)],
        "b_right_a_wrong": fixed, "a_right_b_wrong": broken, "p_value": round(p_value, 6),
        "verdict": verdict(len(broken), len(fixed), p_value, n), "per_class": per_class_changes(pairs),
    }
