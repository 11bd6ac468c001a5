"""Plots drawn from run-directory files only (never from the engine's objects).

plots/loss.png       train and val loss per epoch (the guide's figure)
plots/accuracy.png   train top-1, val top-1 and top-5 per epoch
plots/confusion.png  the last evaluation's confusion matrix (row-normalised)
eval/plots/reliability.png  reliability diagrams before and after temperature scaling (eval/calibration.json)
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from inceptionlab.fileio import atomic_write, read_jsonl


def _read_rows(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / "metrics.jsonl")


def new_figure(figsize: tuple[float, float], rows: int = 1, cols: int = 1, **subplots: Any) -> tuple[Figure, Any]:
    """A figure drawn by Agg into files, and its axes: matplotlib's object API, so nothing of the process
    changes (no `matplotlib.use`, no pyplot figure registry to close, safe beside a GUI or in threads)."""
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, cols, **subplots)


def save_figure(fig: Figure, path: Path) -> Path:
    """Write a figure atomically (temp name + rename)."""
    atomic_write(path, lambda handle: fig.savefig(handle, format=path.suffix.lstrip(".") or "png", dpi=120,
                                                  bbox_inches="tight"))
    return path


def plot_curves(run_dir: Path, rows: list[dict], keys: list[tuple[str, str]], ylabel: str, name: str) -> Path | None:
    present = [(k, label) for k, label in keys if any(k in r for r in rows)]
    if not rows or not present:
        return None
    fig, ax = new_figure((6.4, 4.0))
    for key, label in present:
        points = [(r["epoch"], r[key]) for r in rows if key in r]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=label)
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"{run_dir.parent.name}/{run_dir.name}", fontsize=9)
    return save_figure(fig, run_dir / "plots" / name)


def plot_confusion(csv_path: Path, out: Path) -> Path | None:
    if not csv_path.exists():
        return None
    with open(csv_path) as handle:
        rows = list(csv.reader(handle))
    labels = rows[0][1:]
    matrix = np.array([[float(v) for v in row[1:]] for row in rows[1:]])
    normalised = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    n = len(labels)
    size = min(4 + n * 0.35, 16)
    fig, ax = new_figure((size, size))
    image = ax.imshow(normalised, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="fraction of true class")
    if n <= 40:  # beyond that, tick labels are unreadable anyway
        ax.set_xticks(range(n), labels, rotation=90, fontsize=7)
        ax.set_yticks(range(n), labels, fontsize=7)
        if n <= 15:
            for i in range(n):
                for j in range(n):
                    if matrix[i, j]:
                        ax.text(j, i, int(matrix[i, j]), ha="center", va="center", fontsize=7,
                                color="white" if normalised[i, j] > 0.5 else "black")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    return save_figure(fig, out)


def plot_reliability(calibration_json: Path, out: Path) -> Path | None:
    """Accuracy against confidence per bin, before and after temperature scaling (Guo et al.'s figure):
    bars on the diagonal are calibrated; the red hatched box between a bar's top and the images' mean
    confidence is its gap (above the bar: overconfident). A strip under each panel counts the images per bin."""
    if not Path(calibration_json).exists():
        return None
    data = json.loads(Path(calibration_json).read_text())
    fig, axes = new_figure((9.0, 5.2), 2, 2, sharex=True, gridspec_kw={"height_ratios": [4, 1]})
    panels = (("before", f"before: T = 1, ECE {data['ece_before']:.3f}"),
              ("after", f"after: T = {data['temperature']:.3g}, ECE {data['ece_after']:.3f}"))
    for column, (key, title) in enumerate(panels):
        bins = data[f"bins_{key}"]
        lower = np.array([b["lower"] for b in bins])
        width = lower[1] - lower[0] if len(lower) > 1 else 1.0
        centre = lower + width / 2
        accuracy = np.array([b["accuracy"] if b["count"] else 0.0 for b in bins])
        confidence = np.array([b["confidence"] if b["count"] else c for b, c in zip(bins, centre)])
        counts = np.array([b["count"] for b in bins])
        ax, strip = axes[0, column], axes[1, column]
        ax.bar(centre, accuracy, width=width * 0.95, color="#4a7ab7", edgecolor="white", label="accuracy")
        gap_low, gap = np.minimum(accuracy, confidence), np.abs(confidence - accuracy)
        ax.bar(centre[counts > 0], gap[counts > 0], bottom=gap_low[counts > 0], width=width * 0.95, fill=False,
               hatch="///", edgecolor="#d9534f", linewidth=1.0, label="gap to mean confidence")
        ax.plot([0, 1], [0, 1], color="#333333", linestyle="--", linewidth=1, label="calibrated")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("accuracy" if column == 0 else "")
        ax.grid(alpha=0.3)
        strip.bar(centre, counts, width=width * 0.95, color="#888888")
        strip.set_xlabel("confidence (top-1 probability)")
        strip.set_ylabel("images" if column == 0 else "")
    axes[0, 0].legend(loc="upper left", fontsize=8)
    fig.suptitle(f"reliability on {data['samples']} images", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out)


def plot_run(run_dir: Path) -> list[Path]:
    """(Re)draw every plot a run directory's files allow; returns the files written."""
    run_dir = Path(run_dir)
    rows = _read_rows(run_dir)
    made = [
        # With EMA on, val_* are the averaged weights' and val_raw_* the trained weights' (engine/fit.py).
        plot_curves(run_dir, rows, [("train_loss", "train"), ("val_loss", "val"), ("val_raw_loss", "val, raw weights")],
                    "cross-entropy loss", "loss.png"),
        plot_curves(run_dir, rows, [("train_top1", "train top-1"), ("val_top1", "val top-1"), ("val_top5", "val top-5"),
                                    ("val_raw_top1", "val top-1, raw weights")], "accuracy", "accuracy.png"),
        plot_confusion(run_dir / "confusion.csv", run_dir / "plots" / "confusion.png"),
    ]
    return [p for p in made if p is not None]


def _as_display(image) -> np.ndarray:
    """uint8 CHW tensor -> HWC (or HW for one channel) numpy array for imshow.

    Normalised float images (from the resident image loader) are stretched to 0..1 per image.
    """
    if hasattr(image, "is_floating_point") and image.is_floating_point():
        image = image.float()
        image = (image - image.min()) / (image.max() - image.min()).clamp(min=1e-6)
    array = np.asarray(image)
    return array[0] if array.shape[0] == 1 else array.transpose(1, 2, 0)


def plot_samples(images, labels: list[str], path: Path) -> Path:
    """A grid of training images (uint8 CHW) with their labels (the CIFAR-10 case study's image grid)."""
    n = len(images)
    cols = min(8, n)
    rows = -(-n // cols)
    fig, axes = new_figure((cols * 1.4, rows * 1.6), rows, cols, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, image, label in zip(axes.flat, images, labels):
        ax.imshow(_as_display(image), cmap="gray" if image.shape[0] == 1 else None)
        ax.set_title(label, fontsize=7)
    return save_figure(fig, path)


def plot_predictions(images, probs, targets, labels: list[str], path: Path) -> Path:
    """The Fashion-MNIST case study's figure: each image with 'predicted confidence (true)' in blue
    when right and red when wrong, beside a bar chart of its class probabilities."""
    n = len(images)
    cols = 3
    rows = -(-n // cols)
    fig, axes = new_figure((2 * cols * 1.6, rows * 1.7), rows, 2 * cols, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i in range(n):
        row, col = divmod(i, cols)
        image_ax, bar_ax = axes[row, 2 * col], axes[row, 2 * col + 1]
        predicted, truth = int(probs[i].argmax()), int(targets[i])
        colour = "tab:blue" if predicted == truth else "tab:red"
        image_ax.imshow(_as_display(images[i]), cmap="binary" if images[i].shape[0] == 1 else None)
        image_ax.set_title(f"{labels[predicted]} {100 * float(probs[i][predicted]):.0f}% ({labels[truth]})",
                           fontsize=7, color=colour)
        bar_ax.axis("on")
        bars = bar_ax.bar(range(len(probs[i])), probs[i].numpy(), color="#777777")
        bars[predicted].set_color("tab:red")
        bars[truth].set_color("tab:blue")
        bar_ax.set_ylim(0, 1)
        bar_ax.set_xticks([])
        bar_ax.set_yticks([])
    fig.tight_layout()
    return save_figure(fig, path)


def plot_lr_find(tests: dict[str, dict[str, Any]], path: Path) -> Path:
    """The range tests' smoothed loss against the learning rate (log scale), each suggestion marked."""
    fig, ax = new_figure((6.4, 4.0))
    draw_lr_find(ax, tests)
    return save_figure(fig, path)


def draw_lr_find(ax: Any, tests: dict[str, dict[str, Any]]) -> None:
    """Each test's curve, its suggestion a dashed line and a point on the curve; the y-axis spans the
    lowest loss to a bit above the highest of the starts and the suggestions' points, so a diverging tail
    does not flatten the rest and no mark sits off the axes."""
    lows, highs = [], []
    for part, test in tests.items():
        lrs, smoothed = test["lrs"][: len(test["smoothed"])], test["smoothed"]
        if not smoothed:
            continue
        lows.append(min(smoothed))
        highs.append(smoothed[0])
        line, = ax.plot(lrs, smoothed, label=f"{part}")
        suggestion = test.get("suggestion")
        if suggestion:
            at = smoothed[min(range(len(lrs)), key=lambda i: abs(math.log(lrs[i] / suggestion)))]
            highs.append(at)
            ax.axvline(suggestion, color=line.get_color(), linestyle="--", alpha=0.7)
            ax.scatter([suggestion], [at], color=line.get_color(), zorder=3, label=f"{part}: suggested {suggestion:.2g}")
    ax.set_xscale("log")
    if lows:
        low, high = min(lows), max(highs)
        span = high - low + 1e-9
        ax.set_ylim(low - 0.1 * span, high + 0.5 * span)
    ax.set_xlabel("learning rate")
    ax.set_ylabel("training loss (smoothed)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("learning-rate range test (steepest descent before the minimum marked)", fontsize=9)
