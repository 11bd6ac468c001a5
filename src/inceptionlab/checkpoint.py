"""Run directories and checkpoints: everything written atomically (temp file + rename).

A run directory is the only hand-off between commands (see DESIGN.md):

    runs/<recipe-name>/<YYYYmmdd-HHMMSS>/
      recipe.resolved.yaml  env.json  spec.json  metrics.jsonl  summary.json
      checkpoints/{last.pt,best.pt}  model.pt  plots/  tb/

Checkpoints describe themselves: model, optimizer, scheduler, scaler, epoch, step, RNG states, best
metric, class names, the resolved recipe and the model spec. They load with `weights_only=True`.

Under DDP only rank 0 writes, but every rank draws from RNG streams of its own (seeded with seed + rank:
its dropout masks and host-side augmentation), so a checkpoint holds every rank's RNG state
(`rng_by_rank`, gathered to the writer) and each rank restores its own; restoring rank 0's on every
rank would give all ranks the same masks and crops after a resume.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from inceptionlab.errors import UserError
from inceptionlab.fileio import append_jsonl, read_jsonl, write_jsonl

CHECKPOINT_VERSION = 1


def rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """The process's RNG streams: torch's CPU generator, Python's, NumPy's, and the run's own GPU's
    when `device` is one (`cuda`: that device's state alone). Never every visible GPU: another GPU's
    stream is not the run's, a host with fewer GPUs could not restore it, and asking a GPU for its
    state initialises CUDA, which a CPU run on a GPU host must not do."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": list(random.getstate()[1]),
        "python_version": random.getstate()[0],
        "python_gauss": random.getstate()[2],
        "numpy": torch.from_numpy(np.random.get_state()[1].astype(np.int64)),
        "numpy_pos": int(np.random.get_state()[2]),
    }
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng_state(state: dict[str, Any], device: torch.device | None = None) -> None:
    """`rng_state`'s inverse; the GPU stream only on a GPU run, into the run's device whatever its index."""
    torch.set_rng_state(state["torch"])
    random.setstate((state["python_version"], tuple(state["python"]), state["python_gauss"]))
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), state["numpy_pos"], 0, 0.0))
    saved = state.get("cuda")
    if device is None or device.type != "cuda" or saved is None:
        return
    if isinstance(saved, (list, tuple)):  # earlier versions saved every visible GPU's state, by index
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= len(saved):
            return  # that device's stream was not saved: keep the seeded one
        saved = saved[index]
    torch.cuda.set_rng_state(saved, device)


@dataclass
class ResumePoint:
    """Where a checkpoint leaves training: epochs fully done, steps done in the next, best so far."""

    epoch: int
    step_in_epoch: int
    best: dict[str, Any]
    best_summary: dict[str, Any] | None
    rng_by_rank: list[dict[str, Any]] | None = None  # every rank's `rng_state()`, in rank order (to save)


def training_checkpoint(parts: dict[str, Any], point: ResumePoint, *, class_names: list[str],
                        recipe: dict[str, Any], spec: dict[str, Any], device: torch.device | None = None) -> dict[str, Any]:
    """The checkpoint schema. `parts` maps model/optimizer/scheduler/scaler to objects with state_dict();
    `device` is the run's (its GPU's RNG stream is saved with the CPU's)."""
    return {
        "version": CHECKPOINT_VERSION,
        **{name: part.state_dict() for name, part in parts.items()},
        "epoch": point.epoch,  # epochs fully done
        "step_in_epoch": point.step_in_epoch,  # steps done in epoch `epoch` (0 at an epoch boundary)
        "rng": rng_state(device),  # this process's: rank 0's under DDP, the only one in a single-process run
        **({"rng_by_rank": point.rng_by_rank} if point.rng_by_rank and len(point.rng_by_rank) > 1 else {}),
        "best": point.best,
        "best_summary": json.dumps(point.best_summary) if point.best_summary else None,
        "class_names": class_names,
        "recipe": json.dumps(recipe),
        "spec": json.dumps(spec),
    }


def restore_training(ckpt: dict[str, Any], parts: dict[str, Any], class_names: list[str], rank: int = 0,
                     device: torch.device | None = None) -> ResumePoint:
    """Load every part's state and this rank's RNG states back; the inverse of `training_checkpoint`.

    A rank the checkpoint has no state for (resumed on more processes than it was saved from) keeps
    the streams `seed + rank` gave it: its own, if not the continuation of any earlier rank's."""
    if ckpt["class_names"] != class_names:
        raise UserError("the checkpoint's classes differ from the dataset's: resume with the same --data")
    for name, part in parts.items():
        part.load_state_dict(ckpt[name])
    by_rank = ckpt.get("rng_by_rank") or [ckpt["rng"]]
    if rank < len(by_rank):
        restore_rng_state(by_rank[rank], device)
    best_summary = json.loads(ckpt["best_summary"]) if ckpt.get("best_summary") else None
    return ResumePoint(int(ckpt["epoch"]), int(ckpt["step_in_epoch"]), ckpt["best"], best_summary)


def load_checkpoint(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: checkpoint not found")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise UserError(
            f"{path}: unreadable checkpoint ({type(exc).__name__}); it may be truncated: "
            "resume from checkpoints/best.pt or start a new run"
        ) from None
    if not isinstance(ckpt, dict) or ckpt.get("version") != CHECKPOINT_VERSION or "model" not in ckpt:
        raise UserError(f"{path}: not an inceptionlab checkpoint (version {CHECKPOINT_VERSION})")
    return ckpt


@dataclass
class RunDir:
    path: Path

    @classmethod
    def create(cls, out: Path, recipe_name: str) -> "RunDir":
        """A new, never-existing run directory under out/<recipe-name>/."""
        parent = Path(out) / recipe_name
        parent.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for suffix in [""] + [f"-{i}" for i in range(1, 1000)]:
            candidate = parent / f"{stamp}{suffix}"
            try:
                candidate.mkdir()
            except FileExistsError:
                continue
            return cls(candidate)
        raise UserError(f"{parent}: could not create a new run directory")

    @staticmethod
    def is_run(path: Path) -> bool:
        """A folder made by `inceptionlab train` (it holds spec.json), which `open` takes."""
        return (Path(path) / "spec.json").is_file()

    @classmethod
    def open(cls, path: Path) -> "RunDir":
        path = Path(path)
        if not cls.is_run(path):
            raise UserError(f"{path}: not a run directory (no spec.json); give a folder made by `inceptionlab train`")
        return cls(path)

    # Paths (DESIGN.md's layout).
    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def last(self) -> Path:
        return self.checkpoints / "last.pt"

    @property
    def best(self) -> Path:
        return self.checkpoints / "best.pt"

    @property
    def model_file(self) -> Path:
        return self.path / "model.pt"

    @property
    def spec_file(self) -> Path:
        return self.path / "spec.json"

    @property
    def weights_record(self) -> Path:
        """Where the starting weights came from and what was decided on them (models/weights.py)."""
        return self.path / "weights.json"

    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def summary_file(self) -> Path:
        return self.path / "summary.json"

    @property
    def plots(self) -> Path:
        return self.path / "plots"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tb"

    def append_metrics(self, row: dict[str, Any]) -> None:
        append_jsonl(self.metrics_file, [row])

    def read_metrics(self) -> list[dict[str, Any]]:
        return read_jsonl(self.metrics_file)

    def truncate_metrics(self, epochs_done: int) -> None:
        """Drop rows of epochs after the checkpoint we resume from (they will be redone)."""
        write_jsonl(self.metrics_file, [r for r in self.read_metrics() if r.get("epoch", 0) <= epochs_done])

    def weights_for_inference(self) -> Path:
        """model.pt when training finished, else the best checkpoint so far."""
        for candidate in (self.model_file, self.best, self.last):
            if candidate.is_file():
                return candidate
        raise UserError(f"{self.path}: no model.pt or checkpoint yet; train first or wait for the first epoch")
