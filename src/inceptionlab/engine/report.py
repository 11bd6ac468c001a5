"""What a person watching training sees: progress bars on a terminal, plain lines otherwise, rank 0 only."""

from __future__ import annotations

import sys
from typing import Any, Callable

from tqdm import tqdm


class Reporter:
    """Progress (tqdm) on a terminal, plain lines in logs; silent on ranks other than 0."""

    def __init__(self, enabled: bool, progress: bool | None):
        self.enabled = enabled
        self.bar_enabled = enabled and (sys.stderr.isatty() if progress is None else progress)
        self.bar: Any = None

    def say(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def wrap(self, loader: Any, epoch: int, epochs: int, first_step: int) -> Any:
        if not self.bar_enabled:
            return loader

        self.bar = tqdm(loader, total=len(loader) + first_step, initial=first_step,
                        desc=f"epoch {epoch}/{epochs}", unit="step", dynamic_ncols=True, leave=False)
        return self.bar

    def on_log(self, epoch: int, epochs: int, steps: int) -> Callable[[int, float], None]:
        def log(step: int, loss: float) -> None:
            if self.bar is not None:
                self.bar.set_postfix(loss=f"{loss:.4f}")
            else:
                self.say(f"epoch {epoch}/{epochs} step {step}/{steps} loss {loss:.4f}")

        return log

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


# The keys of an epoch's metrics row: what train.best_metric may name (engine/choices.py checks it before
# the run). With EMA on, val_* score the averaged weights (the ones the run keeps) and val_raw_* the
# trained ones.
EPOCH_METRICS = ("train_loss", "train_top1", "val_loss", "val_top1", "val_top5", "val_raw_loss", "val_raw_top1",
                 "val_raw_top5")


def epoch_line(row: dict[str, Any], epochs: int, skipped: list[str], unit: str = "img/s") -> str:
    """The epoch's figures in one line; `unit` names what the throughput counts (samples/s for text)."""
    line = (
        f"epoch {row['epoch']}/{epochs}  train_loss {row['train_loss']:.4f}  val_loss {row['val_loss']:.4f}  "
        f"val_top1 {row['val_top1']:.4f}  " + (f"val_top5 {row['val_top5']:.4f}  " if "val_top5" in row else "") +
        (f"(raw weights: val_loss {row['val_raw_loss']:.4f} val_top1 {row['val_raw_top1']:.4f})  "
         if "val_raw_top1" in row else "") +
        f"lr {row['lr']:.3g}  " + (f"body {row['lr_body']:.3g}  " if row.get("lr_body", row["lr"]) != row["lr"] else "") +
        f"{row['images_per_s']:.1f} {unit}  {row['epoch_seconds']:.1f}s"
    )
    if skipped:
        line += f"  ({skipped_files_note(skipped)})"
    return line


def start_line(row: dict[str, Any], epochs: int) -> str:
    """Epoch 0: how the starting weights score before the first step."""
    return (f"epoch 0/{epochs} (the starting weights)  val_loss {row['val_loss']:.4f}  val_top1 {row['val_top1']:.4f}"
            + (f"  val_top5 {row['val_top5']:.4f}" if "val_top5" in row else "") + f"  {row['val_seconds']:.1f}s")


SKIPPED_SHOWN = 3  # files named in an epoch line; summary.json's skipped_reasons has all of them


def skipped_files_note(skipped: list[str]) -> str:
    """'skipped N unreadable image(s): PATH: REASON; ...' for the first few, each with its reason when known."""
    unique = sorted(set(skipped))
    by_path = {str(path): path for path in skipped}  # the UnreadableFile (with .problem) of each path
    shown = "; ".join(_described(by_path[str(path)]) for path in unique[:SKIPPED_SHOWN])
    more = f"; and {len(unique) - SKIPPED_SHOWN} more (summary.json)" if len(unique) > SKIPPED_SHOWN else ""
    return f"skipped {len(unique)} unreadable image(s): {shown}{more}"


def _described(path: str) -> str:
    problem = getattr(path, "problem", "")
    return f"{path}: {problem}" if problem else str(path)


def chain(*callbacks: Callable[[int, float], None] | None) -> Callable[[int, float], None]:
    """One on_log callback calling each of `callbacks` that is set."""
    def call(step: int, loss: float) -> None:
        for callback in callbacks:
            if callback is not None:
                callback(step, loss)

    return call
