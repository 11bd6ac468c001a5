"""The per-image results table: what `evaluate` hands to the error report, calibration and label checks.

`evaluate` writes three files beside eval.json (the schema is docs/run-directory.md's):

    results.csv    one row per scored image: file, true and predicted class, correct, loss, the true
                   class's probability, the top-k classes with their probabilities
    logits.npy     float32 (rows, classes): the model's raw logits, row i of the table in row i
    results.json   what the rows mean: class labels in logit-column order, task, split, model, top-k

Everything after evaluation reads these with `read_results` and never runs the model again (Grad-CAM
overlays are the one exception: they need the model's gradients). CSV, not Parquet: pandas
(`read_csv`) and DuckDB (`read_csv_auto`) read it with no extra package, where Parquet needs pyarrow
(a ~40 MB wheel) in every environment that evaluates; the logits go to .npy because 200 classes x
10,000 images as decimal text is ~25 MB and slow to parse, against 8 MB of exact float32.

A binary task (one logit z) is stored as the two logits [0, z]: softmax gives [1 - sigmoid(z),
sigmoid(z)], so every reader computes probabilities (and fits a temperature: [0, z] / T = [0, z / T])
the same way for both task kinds.
"""

from __future__ import annotations

import csv
import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from torch.nn import functional as F

from inceptionlab.errors import UserError
from inceptionlab.fileio import atomic_write, atomic_write_json, atomic_write_text

SCHEMA_VERSION = 1
RESULTS_CSV = "results.csv"
LOGITS_NPY = "logits.npy"
RESULTS_JSON = "results.json"
TOPK = 5  # top-k columns per row (fewer for models with fewer classes)
# Probabilities and losses with 6 decimals: below any threshold a user sets, and the table stays small.
DECIMALS = 6


def as_two_class(logits: torch.Tensor) -> torch.Tensor:
    """(N, C) logits unchanged; (N,) or (N, 1) binary logits z -> (N, 2) [0, z] (see the module doc)."""
    if logits.ndim == 2 and logits.shape[1] > 1:
        return logits.float()
    z = logits.reshape(-1, 1).float()
    return torch.cat([torch.zeros_like(z), z], dim=1)


@dataclass
class LogitsRecorder:
    """Collects every batch's logits and targets on the device; one copy to the host at the end
    (`engine.loop.evaluate(on_batch=recorder)`), so recording adds no per-batch synchronisation."""

    logits: list[torch.Tensor] = field(default_factory=list)
    targets: list[torch.Tensor] = field(default_factory=list)

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        self.logits.append(as_two_class(logits.detach()))
        self.targets.append(targets.detach())

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(float32 logits (N, C), int64 targets (N,)) in the order the batches came."""
        if not self.logits:
            return np.zeros((0, 0), np.float32), np.zeros(0, np.int64)
        return (torch.cat(self.logits).cpu().numpy().astype(np.float32),
                torch.cat(self.targets).cpu().numpy().astype(np.int64))


def _base_dataset(dataset: Any) -> tuple[Any, list[int], list[int] | None]:
    """The dataset under relabelling/subset wrappers, the indices into it in the wrapper's order, and
    the relabelling (folder index -> model output index) if one wraps it."""
    order: list[int] | None = None
    mapping: list[int] | None = None
    while True:
        if hasattr(dataset, "indices") and hasattr(dataset, "dataset"):  # torch Subset (capped samples)
            inner = list(dataset.indices)
            order = inner if order is None else [inner[i] for i in order]
            dataset = dataset.dataset
        elif hasattr(dataset, "mapping") and hasattr(dataset, "dataset"):  # evaluate's TargetMap
            mapping = list(dataset.mapping)
            dataset = dataset.dataset
        else:
            return dataset, order if order is not None else list(range(len(dataset))), mapping


@dataclass
class SampleFiles:
    samples: list[int]  # index of each row's sample in the split
    files: list[str]  # each row's file, "" for in-memory splits
    targets: list[int] | None  # each row's class as the files say (None: in-memory splits)


def sample_files(dataset: Any, skipped: Sequence[str]) -> SampleFiles:
    """Sample index, file and class of every row the evaluation loop scored, in loader order.

    Evaluation reads the split in order (no shuffling) and drops undecodable files, which the loader
    names in `skipped`; the rows are the rest, in order. In-memory splits have no files.
    """
    base, order, mapping = _base_dataset(dataset)
    samples = getattr(base, "samples", None)
    if samples is None:
        return SampleFiles(order, [""] * len(order), None)
    unreadable = set(skipped)
    kept = [i for i in order if samples[i][0] not in unreadable]
    targets = [samples[i][1] if mapping is None else mapping[samples[i][1]] for i in kept]
    return SampleFiles(kept, [str(Path(samples[i][0]).absolute()) for i in kept], targets)


def check_aligned(rows: SampleFiles, targets: np.ndarray) -> None:
    """The program's own failure if the loader's order is not the split's: rows would name wrong files."""
    if len(rows.samples) != len(targets) or (rows.targets is not None and rows.targets != targets.tolist()):
        raise RuntimeError(f"per-image results out of step with the split: {len(targets)} scored, "
                           f"{len(rows.samples)} files expected (the evaluation loader must keep the split's order)")


def _topk_columns(k: int) -> list[str]:
    return [f"top{r}_{what}" for r in range(1, k + 1) for what in ("index", "label", "prob")]


COLUMNS = ["row", "sample", "file", "true_index", "true_label", "pred_index", "pred_label", "correct", "loss",
           "p_true", "p_pred"]


def table_rows(logits: np.ndarray, targets: np.ndarray, files: Sequence[str], samples: Sequence[int],
               labels: Sequence[str], topk: int = TOPK) -> Iterator[dict[str, Any]]:
    """One dict per image, in COLUMNS + top-k column order."""
    scores = torch.from_numpy(logits)
    target = torch.from_numpy(targets)
    probs = scores.softmax(dim=1)
    losses = F.cross_entropy(scores, target, reduction="none")
    k = min(topk, scores.shape[1])
    top_p, top_i = probs.topk(k, dim=1)
    for row in range(len(targets)):
        true, pred = int(target[row]), int(top_i[row, 0])
        item: dict[str, Any] = {
            "row": row, "sample": int(samples[row]), "file": files[row],
            "true_index": true, "true_label": labels[true], "pred_index": pred, "pred_label": labels[pred],
            "correct": int(true == pred), "loss": round(max(0.0, float(losses[row])), DECIMALS),
            "p_true": round(float(probs[row, true]), DECIMALS), "p_pred": round(float(top_p[row, 0]), DECIMALS),
        }
        for rank in range(k):
            index = int(top_i[row, rank])
            item[f"top{rank + 1}_index"] = index
            item[f"top{rank + 1}_label"] = labels[index]
            item[f"top{rank + 1}_prob"] = round(float(top_p[row, rank]), DECIMALS)
        yield item


def write_results(out_dir: Path, logits: np.ndarray, targets: np.ndarray, *, files: Sequence[str],
                  samples: Sequence[int], labels: Sequence[str], meta: dict[str, Any],
                  topk: int = TOPK, answers: Any = None) -> dict[str, Path]:
    """results.csv, logits.npy and results.json under out_dir (each written atomically). With the decision
    rule's `answers` (models/rule.py) of a rule that rejects, each row also says whether the rule answered
    unknown and why (`unknown`, `reason`), and with a kNN bank its distance (`knn_distance`)."""
    if len(logits) != len(targets) or len(files) != len(targets) or len(samples) != len(targets):
        raise RuntimeError(f"results table out of step: {len(logits)} logits, {len(targets)} targets, "
                           f"{len(files)} files, {len(samples)} sample indices")
    paths = {"results_csv": out_dir / RESULTS_CSV, "logits": out_dir / LOGITS_NPY, "results_json": out_dir / RESULTS_JSON}
    k = min(topk, logits.shape[1]) if len(logits) else 0
    rows = table_rows(logits, targets, files, samples, labels, topk)
    extra = answer_columns(answers, len(targets))
    if extra:
        rows = ({**row, **{name: values[i] for name, values in extra.items()}} for i, row in enumerate(rows))
    atomic_write_text(paths["results_csv"], _csv_text(COLUMNS + _topk_columns(k) + list(extra), rows))
    atomic_write(paths["logits"], lambda handle: np.save(handle, logits.astype(np.float32)))
    atomic_write_json(paths["results_json"], {
        "schema": SCHEMA_VERSION, "table": RESULTS_CSV, "logits": LOGITS_NPY, "rows": int(len(targets)),
        "topk": k, "labels": list(labels), **meta, "written": time.strftime("%Y-%m-%dT%H:%M:%S"),
    })
    return paths


def answer_columns(answers: Any, count: int) -> dict[str, list[Any]]:
    """The rule's columns of the table: none for a rule that never answers unknown."""
    if answers is None or len(answers) != count:
        return {}
    columns: dict[str, list[Any]] = {"unknown": [int(u) for u in answers.unknown],
                                     "reason": [r or "" for r in answers.reason]}
    if answers.distance is not None:
        columns["knn_distance"] = [round(float(d), DECIMALS) for d in answers.distance]
    return columns


def _csv_text(columns: list[str], rows: Iterator[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


@dataclass
class Results:
    """The table as read back: rows (dicts with typed values), logits, and results.json's fields."""

    rows: list[dict[str, Any]]
    logits: np.ndarray
    meta: dict[str, Any]
    folder: Path

    @property
    def labels(self) -> list[str]:
        return list(self.meta["labels"])

    @property
    def targets(self) -> np.ndarray:
        return np.array([r["true_index"] for r in self.rows], dtype=np.int64)

    def probabilities(self, temperature: float = 1.0) -> np.ndarray:
        """softmax(logits / T) as float64 (N, C)."""
        return torch.from_numpy(self.logits).double().div(temperature).softmax(dim=1).numpy()


_INT_COLUMNS = {"row", "sample", "true_index", "pred_index", "correct", "unknown"}
_FLOAT_COLUMNS = {"loss", "p_true", "p_pred", "knn_distance"}


def _typed(row: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        if key in _INT_COLUMNS or (key.startswith("top") and key.endswith("_index")):
            out[key] = int(value)
        elif key in _FLOAT_COLUMNS or key.endswith("_prob"):
            out[key] = float(value)
        else:
            out[key] = value
    return out


def results_folder(path: Path) -> Path:
    """The folder holding results.json: given as is, or a run directory's eval/."""
    path = Path(path)
    return path if (path / RESULTS_JSON).is_file() or not (path / "eval").is_dir() else path / "eval"


def read_results(path: Path) -> Results:
    """The table under `path` (an eval folder, or a run directory with eval/), checked for consistency."""
    folder = results_folder(path)
    meta_file = folder / RESULTS_JSON
    if not meta_file.is_file():
        raise UserError(f"{folder}: no per-image results ({RESULTS_JSON}); run `inceptionlab evaluate "
                        f"{folder.parent if folder.name == 'eval' else folder}` first")
    meta = json.loads(meta_file.read_text())
    if meta.get("schema") != SCHEMA_VERSION:
        raise UserError(f"{meta_file}: results schema {meta.get('schema')} is not {SCHEMA_VERSION}; "
                        "run `inceptionlab evaluate` again to rewrite it")
    with open(folder / meta["table"], newline="") as handle:
        rows = [_typed(row) for row in csv.DictReader(handle)]
    logits = np.load(folder / meta["logits"])
    if len(rows) != meta["rows"] or logits.shape[0] != len(rows):
        raise UserError(f"{folder}: {len(rows)} table rows, {logits.shape[0]} logit rows, results.json says "
                        f"{meta['rows']}; the files are from different evaluations: run `inceptionlab evaluate` again")
    return Results(rows, logits, meta, folder)
