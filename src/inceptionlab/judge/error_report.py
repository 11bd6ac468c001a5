"""The error report: one self-contained HTML page of what the model got wrong, from the per-image table.

    summary = write_report(read_results(run_dir), run_dir / "eval" / "report.html", ReportSettings())

The page holds the top losses, the most-confused pairs, per-class precision and recall, a confusion
matrix whose cells show their images when clicked, a gallery of the misclassified images, and the
likely label errors (judge/label_errors.py), each image as a small embedded JPEG thumbnail; the
misclassified images with the highest loss also get a Grad-CAM overlay (judge/explain.py) of the class
the model chose. Everything but the overlays comes from results.csv and logits.npy; the page needs no
server and no network (open the file, or mail it).
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image

from inceptionlab.config import load_recipe
from inceptionlab.data.io.decode import ImageReadError, load_rgb
from inceptionlab.data.readers import read_eval_split
from inceptionlab.errors import UserError
from inceptionlab.fileio import atomic_write_text
from inceptionlab.judge.explain import Explainer, overlay
from inceptionlab.judge.label_errors import held_out, likely_label_errors
from inceptionlab.judge.results import Results
from inceptionlab.models.knn import FAR
from inceptionlab.models.registry import load_pretrained_model, load_run_model

log = logging.getLogger(__name__)

REPORT_HTML = "report.html"
# Thumbnails: 96 px a side at JPEG quality 70 is ~2-4 KB each, so the page's few hundred images stay
# within a few MB and open at once.
THUMB_SIDE = 96
THUMB_QUALITY = 70


@dataclass
class ReportSettings:
    """How much the page shows (each a count of images or rows)."""

    top_losses: int = 24  # highest-loss images, right or wrong
    misclassified: int = 200  # the gallery of wrong answers, highest loss first
    per_cell: int = 24  # images a confusion-matrix cell shows when clicked
    matrix_classes: int = 30  # classes in the matrix: all up to this many, else those with the most errors
    pairs: int = 20  # most-confused pairs listed
    label_issues: int = 50  # likely label errors listed
    cam: int = 24  # Grad-CAM overlays, for the highest-loss misclassified images (0: none)


# --- numbers (also `report --json`) -----------------------------------------------------------------------


def confusion_matrix(results: Results) -> np.ndarray:
    """(C, C) counts over the table, rows true, columns predicted."""
    count = len(results.labels)
    matrix = np.zeros((count, count), dtype=np.int64)
    for row in results.rows:
        matrix[row["true_index"], row["pred_index"]] += 1
    return matrix


def per_class(results: Results, matrix: np.ndarray) -> list[dict[str, Any]]:
    """Precision, recall and F1 of every class that occurs or is predicted; worst recall first."""
    labels = results.labels
    table = []
    for c in np.flatnonzero(matrix.sum(axis=0) + matrix.sum(axis=1)):
        hits, support, predicted = int(matrix[c, c]), int(matrix[c].sum()), int(matrix[:, c].sum())
        precision = hits / predicted if predicted else None
        recall = hits / support if support else None
        f1 = (2 * precision * recall / (precision + recall) if precision and recall else
              0.0 if precision is not None and recall is not None else None)
        table.append({"index": int(c), "label": labels[c], "support": support, "predicted": predicted,
                      "precision": _round(precision), "recall": _round(recall), "f1": _round(f1)})
    return sorted(table, key=lambda r: (r["recall"] is None, r["recall"] if r["recall"] is not None else 0,
                                        r["label"]))


def most_confused(results: Results, matrix: np.ndarray, limit: int) -> list[dict[str, Any]]:
    """(true, predicted, count) of the off-diagonal cells, largest first."""
    off = matrix.copy()
    np.fill_diagonal(off, 0)
    cells = [(int(t), int(p)) for t, p in zip(*np.nonzero(off))]
    cells.sort(key=lambda tp: (-off[tp], tp))
    labels = results.labels
    return [{"true": labels[t], "pred": labels[p], "true_index": t, "pred_index": p, "count": int(off[t, p])}
            for t, p in cells[:limit]]


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 4)


def _row_brief(results: Results, row: int) -> dict[str, Any]:
    item = results.rows[row]
    return {key: item[key] for key in ("row", "file", "true_label", "pred_label", "p_pred", "p_true", "loss")}


def summarize(results: Results, settings: ReportSettings, issues: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The report's numbers: what `report --json` prints."""
    matrix = confusion_matrix(results)
    rows = results.rows
    by_loss = sorted(range(len(rows)), key=lambda i: -rows[i]["loss"])
    wrong = [i for i in by_loss if not rows[i]["correct"]]
    return {
        "samples": len(rows), "misclassified": len(wrong),
        "top1": round(sum(r["correct"] for r in rows) / len(rows), 6) if rows else None,
        "loss": round(float(np.mean([r["loss"] for r in rows])), 6) if rows else None,
        "split": results.meta.get("split"), "held_out": held_out(results),
        "per_class": per_class(results, matrix),
        "most_confused": most_confused(results, matrix, settings.pairs),
        "top_losses": [_row_brief(results, i) for i in by_loss[: settings.top_losses]],
        "label_issues": issues,
        "unknown": answered_unknown(results, settings.misclassified),
    }


def answered_unknown(results: Results, limit: int) -> dict[str, Any] | None:
    """The images the decision rule answered "unknown" and why (the table's `unknown` and `reason` columns,
    written by evaluate through the rule: models/rule.py), farthest from the training data first, then the
    least sure; None when the table has no such columns (a rule that never answers unknown)."""
    rows = results.rows
    if not rows or "unknown" not in rows[0]:
        return None
    chosen = [i for i, r in enumerate(rows) if r["unknown"]]
    chosen.sort(key=lambda i: (-rows[i].get("knn_distance", 0.0) if rows[i]["reason"] == FAR else 0.0, rows[i]["p_pred"]))
    reasons: dict[str, int] = {}
    for i in chosen:
        reasons[rows[i]["reason"]] = reasons.get(rows[i]["reason"], 0) + 1
    return {"total": len(chosen), "reasons": reasons, "rows": chosen[:limit],
            "reason_of": [_reason_text(rows[i]) for i in chosen[:limit]]}


def _reason_text(row: dict[str, Any]) -> str:
    if row["reason"] == FAR and "knn_distance" in row:
        return f"{FAR} (kNN distance {row['knn_distance']:.3f})"
    return f"{row['reason']} (p {row['p_pred']:.3f})"


# --- pictures ---------------------------------------------------------------------------------------------


def _data_uri(picture: Image.Image) -> str:
    picture = picture.convert("RGB")
    picture.thumbnail((THUMB_SIDE, THUMB_SIDE))
    if max(picture.size) < THUMB_SIDE // 2:  # tiny sources (CIFAR's 32 px): enlarge, keep the pixels sharp
        scale = THUMB_SIDE // max(picture.size)
        picture = picture.resize((picture.width * scale, picture.height * scale), Image.Resampling.NEAREST)
    buffer = io.BytesIO()
    picture.save(buffer, format="JPEG", quality=THUMB_QUALITY)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


class SampleImages:
    """Each row's image: its file, or for in-memory splits (CIFAR-10, Fashion-MNIST, MNIST) its pixels in
    the split, read again through the run's recipe and the dataset's reader (a second at most)."""

    def __init__(self, results: Results):
        self.arrays = _split_arrays(results)

    def picture(self, row: dict[str, Any]) -> Image.Image | None:
        """The image for a thumbnail, or None when there is none (moved or deleted file, text)."""
        if row["file"]:
            try:
                return load_rgb(row["file"], max_side=THUMB_SIDE)
            except (ImageReadError, OSError, ValueError) as exc:
                log.warning("%s: no thumbnail (%s)", row["file"], str(exc).splitlines()[0] if str(exc) else
                            type(exc).__name__)
                return None
        if self.arrays is None:
            return None
        pixels = self.arrays[row["sample"]].permute(1, 2, 0).numpy()
        return Image.fromarray(pixels[..., 0] if pixels.shape[2] == 1 else pixels)

    def model_input(self, row: dict[str, Any], load: Callable[[Path], torch.Tensor]) -> torch.Tensor:
        """uint8 CHW as the model took it: the file through the spec's transform, or the split's pixels."""
        return load(Path(row["file"])) if row["file"] else self.arrays[row["sample"]]  # type: ignore[index]


def _split_arrays(results: Results) -> torch.Tensor | None:
    """uint8 (N, C, H, W) pixels of an in-memory image split the table scored, else None."""
    meta = results.meta
    if not results.rows or results.rows[0]["file"] or not meta.get("run_dir"):
        return None
    overrides = [f"data.root={meta['data']}"] if meta.get("data") else []
    try:
        recipe = load_recipe(Path(meta["run_dir"]) / "recipe.resolved.yaml", overrides)
        split = read_eval_split(recipe.data, None, meta.get("split"))
    except (UserError, OSError) as exc:
        log.warning("no thumbnails: the split could not be read again (%s)", exc)
        return None
    inputs = getattr(split, "inputs", None)
    if not isinstance(inputs, torch.Tensor) or inputs.dtype != torch.uint8 or inputs.ndim != 4:
        return None  # token ids (text), not pixels
    return inputs


CamMaker = Callable[[list[dict[str, Any]]], list[Image.Image]]


def model_cams(results: Results, images: SampleImages, device: torch.device) -> CamMaker:
    """Grad-CAM overlays (of each row's predicted class) by the model the table came from: its run
    directory, or the pretrained model it names."""
    meta = results.meta
    if meta.get("run_dir"):
        model, spec = load_run_model(Path(meta["run_dir"]), Path(meta["weights"]) if meta.get("weights") else None)
    else:
        model, spec = load_pretrained_model(meta["model"], meta.get("weights") or "imagenet")
    explainer = Explainer(model, spec, device)

    def make(rows: list[dict[str, Any]]) -> list[Image.Image]:
        batch = torch.stack([images.model_input(row, explainer.load) for row in rows])
        cams = explainer.maps(batch, [row["pred_index"] for row in rows])
        return [overlay(image, cam) for image, cam in zip(batch, cams)]

    return make


# --- the page ---------------------------------------------------------------------------------------------


def _matrix_classes(matrix: np.ndarray, limit: int) -> list[int]:
    present = [int(c) for c in np.flatnonzero(matrix.sum(axis=1))]
    if len(present) <= limit:
        return present
    off = matrix.copy()
    np.fill_diagonal(off, 0)
    errors = off.sum(axis=0) + off.sum(axis=1)
    return sorted(sorted(present, key=lambda c: (-errors[c], c))[:limit])


def _cells(results: Results, shown: list[int], settings: ReportSettings) -> dict[str, list[int]]:
    """Rows per clickable matrix cell "t,p" (p = -1: a class outside the matrix), highest loss first;
    diagonal cells hold the correct images the model was least sure of."""
    inside = set(shown)
    cells: dict[str, list[int]] = {}
    for i in sorted(range(len(results.rows)), key=lambda i: -results.rows[i]["loss"]):
        row = results.rows[i]
        if row["true_index"] not in inside:
            continue
        pred = row["pred_index"] if row["pred_index"] in inside else -1
        key = f"{row['true_index']},{pred}"
        cap = settings.per_cell if pred != row["true_index"] else min(8, settings.per_cell)
        if len(cells.setdefault(key, [])) < cap:
            cells[key].append(i)
    return cells


def _matrix(results: Results, matrix: np.ndarray, shown: list[int]) -> dict[str, Any]:
    inside = set(shown)
    counts = [[int(matrix[t, p]) for p in shown] + [int(sum(matrix[t, p] for p in range(len(matrix)) if p not in inside))]
              for t in shown]
    return {"classes": shown, "counts": counts, "other": any(row[-1] for row in counts),
            "omitted": int(np.count_nonzero(matrix.sum(axis=1))) - len(shown)}


def page_data(results: Results, settings: ReportSettings, summary: dict[str, Any], images: SampleImages,
              cams: CamMaker | None, notes: list[str]) -> dict[str, Any]:
    """Everything the page draws, as one JSON object (thumbnails as data URIs, each image once)."""
    issues = summary["label_issues"]
    matrix = confusion_matrix(results)
    shown = _matrix_classes(matrix, settings.matrix_classes)
    cells = _cells(results, shown, settings)
    rows = results.rows
    by_loss = sorted(range(len(rows)), key=lambda i: -rows[i]["loss"])
    wrong = [i for i in by_loss if not rows[i]["correct"]]
    top = by_loss[: settings.top_losses]
    gallery = wrong[: settings.misclassified]
    issue_rows = [issue["row"] for issue in (issues or [])]
    unknown_rows = (summary.get("unknown") or {}).get("rows", [])
    wanted = list(dict.fromkeys([*top, *gallery, *[i for v in cells.values() for i in v], *issue_rows, *unknown_rows]))
    items = {i: _item(results, i, images) for i in wanted}
    _add_cams(items, rows, [i for i in wrong if items.get(i, {}).get("thumb")][: settings.cam], cams, notes)
    if len(wrong) > len(gallery):
        notes.append(f"the gallery shows the {len(gallery)} misclassified images with the highest loss, of "
                     f"{len(wrong)}; results.csv lists all")
    return {
        "title": f"Errors of {_model_name(results.meta)} on {results.meta.get('split')}",
        "meta": {k: results.meta.get(k) for k in ("model", "data", "split", "weights", "written")},
        "summary": {k: summary[k] for k in ("samples", "misclassified", "top1", "loss", "held_out")},
        "labels": results.labels, "per_class": summary["per_class"], "pairs": summary["most_confused"],
        "matrix": _matrix(results, matrix, shown), "cells": cells, "items": items,
        "top_losses": top, "misclassified": gallery, "misclassified_total": len(wrong),
        "label_issues": issues, "unknown": summary.get("unknown"), "notes": notes, "generated": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _model_name(meta: dict[str, Any]) -> str:
    """A run as <recipe>/<its folder> (inception_v3/imagefolder/20261122-101500), a pretrained model by its name."""
    if not meta.get("run_dir"):
        return str(meta.get("model") or "the model")
    folder = Path(meta["run_dir"]).name
    return f"{meta['recipe']}/{folder}" if meta.get("recipe") else folder


def _item(results: Results, i: int, images: SampleImages) -> dict[str, Any]:
    row = results.rows[i]
    return {"row": i, "file": row["file"], "name": Path(row["file"]).name if row["file"] else f"sample {row['sample']}",
            "true": row["true_index"], "pred": row["pred_index"], "p_pred": row["p_pred"], "p_true": row["p_true"],
            "loss": row["loss"], "correct": row["correct"], "thumb": _thumb(images.picture(row)), "cam": None}


def _thumb(picture: Image.Image | None) -> str | None:
    return None if picture is None else _data_uri(picture)


def _add_cams(items: dict[int, dict[str, Any]], rows: list[dict[str, Any]], chosen: list[int],
              cams: CamMaker | None, notes: list[str], batch: int = 8) -> None:
    if cams is None or not chosen:
        return
    for start in range(0, len(chosen), batch):
        part = [i for i in chosen[start:start + batch] if items[i]["thumb"] is not None]
        if part:
            for i, picture in zip(part, cams([rows[i] for i in part])):
                items[i]["cam"] = _data_uri(picture)
    notes.append(f"Grad-CAM overlays (where the model looked for the class it chose) on the {len(chosen)} "
                 "misclassified images with the highest loss")


def render(data: dict[str, Any]) -> str:
    """The page: the template with the data inlined (every `<` escaped, so no file name can end the script)."""
    template = resources.files("inceptionlab.judge").joinpath("report_page.html").read_text()
    before, after = template.split("/*DATA*/null")
    title = html.escape(data["title"])
    payload = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    return before.replace("{{TITLE}}", title) + payload + after.replace("{{TITLE}}", title)


def label_issue_rows(results: Results, limit: int) -> tuple[list[dict[str, Any]] | None, str | None]:
    """(the likely label errors as dicts, None) or (None, why there are none to show)."""
    if limit <= 0:
        return None, None
    try:
        issues = likely_label_errors(results)
    except UserError as exc:
        return None, str(exc)
    return [issue.as_dict(results) for issue in issues[:limit]], None


def write_report(results: Results, out: Path, settings: ReportSettings, *, device: torch.device | None = None,
                 cams: CamMaker | None = None) -> dict[str, Any]:
    """Write the page to `out`; return its numbers (summarize's dict, plus "report": the file)."""
    notes: list[str] = []
    images = SampleImages(results)
    if not held_out(results):
        split = results.meta.get("split")
        what = "the training split" if split == results.meta.get("train_split") else f"split {split}"
        notes.append(f"these rows score images the model trained on ({what}): it has seen them, so few label "
                     "errors show and its figures flatter it; evaluate the validation split for a fair check")
    issues, why_not = label_issue_rows(results, settings.label_issues)
    # What the page leaves out goes into `notes`, which the page shows and the command prints: once each.
    if why_not:
        notes.append(f"no label-error ranking: {why_not}")
    if cams is None and settings.cam > 0 and device is not None:
        try:
            cams = model_cams(results, images, device)
        except UserError as exc:
            notes.append(f"no Grad-CAM overlays: {exc}")
    summary = summarize(results, settings, issues)
    atomic_write_text(out, render(page_data(results, settings, summary, images, cams, notes)))
    return {**summary, "notes": notes, "report": str(out)}
