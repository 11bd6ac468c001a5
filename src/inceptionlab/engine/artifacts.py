"""The run directory writer: every file a run leaves, written atomically, on rank 0 only.

`fit` calls the same methods on every rank; ranks other than 0 get `NoArtifacts`, whose methods do
nothing, so the loop has no `if main:` branches (under torchrun one process writes, all compute).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from inceptionlab import hardware
from inceptionlab.checkpoint import ResumePoint, RunDir, training_checkpoint
from inceptionlab.config import recipe_to_dict, recipe_to_yaml
from inceptionlab.engine.session import TrainingSession
from inceptionlab.fileio import atomic_torch_save, atomic_write_json, atomic_write_text
from inceptionlab.metrics import write_confusion
from inceptionlab.runtime import environment


def run_environment(s: TrainingSession) -> dict[str, Any]:
    """env.json: the machine record, and what `auto` chose for this run with its evidence."""
    env = environment(s.device, s.dist.world_size,
                      hardware.backends.record(hardware.device_facts(s.device), s.recipe.train.deterministic))
    if s.speed is not None:
        env["speed"] = s.speed.to_dict()
    return env


class RunArtifacts:
    """Writes DESIGN.md's run directory: recipe, env, spec, metrics, checkpoints, plots, TensorBoard."""

    def __init__(self, run: RunDir):
        self.run = run
        self.writer: Any = None

    def start(self, s: TrainingSession, resumed_at: ResumePoint | None) -> None:
        if resumed_at is not None:
            self.run.truncate_metrics(resumed_at.epoch)  # rows after the checkpoint are redone
        atomic_write_text(self.run.path / "recipe.resolved.yaml", recipe_to_yaml(s.recipe))
        atomic_write_json(self.run.path / "env.json", run_environment(s))
        s.spec.save(self.run.spec_file)
        if s.weights_record is not None and resumed_at is None:  # a resumed run's weights are its checkpoint's
            atomic_write_json(self.run.weights_record, s.weights_record)
        for name, save in s.splits.artifacts.items():  # e.g. the text vectorizer's tokenizer.json
            save(self.run.path / name)
        if s.spec.input_kind == "image" and not (self.run.plots / "samples.png").exists():
            # Drawing a batch runs the random augmentations: keep the RNG stream training will use untouched.
            with torch.random.fork_rng(devices=[]):
                self._plot_first_batch(s)
        # Imported here: TensorBoard's writer pulls in ~0.5 s of protobuf/numpy modules.
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(self.run.tensorboard))

    def checkpoint(self, s: TrainingSession, point: ResumePoint, best: bool = False) -> None:
        """last.pt (and best.pt when `best`): everything `--resume` needs."""
        ckpt = training_checkpoint(s.resumable_parts(), point, class_names=s.spec.class_names,
                                   recipe=recipe_to_dict(s.recipe), spec=s.spec.to_dict(), device=s.device)
        atomic_torch_save(ckpt, self.run.last)
        if best:
            atomic_torch_save(ckpt, self.run.best)

    def epoch(self, s: TrainingSession, row: dict[str, Any], confusion: torch.Tensor, point: ResumePoint, improved: bool) -> None:
        self.run.append_metrics(row)
        for key, value in row.items():
            if key != "epoch":
                self.writer.add_scalar(key.replace("_", "/", 1), value, row["epoch"])
        self.writer.flush()
        self.checkpoint(s, point, best=improved)
        write_confusion(self.run.path / "confusion.csv", s.spec.labels, confusion)

    def finish(self, s: TrainingSession, summary: dict[str, Any]) -> dict[str, Any]:
        """model.pt (when the run was not interrupted), sample predictions, summary.json, plots."""
        from inceptionlab.plots import plot_run  # matplotlib: ~0.4 s, only at the end of a run

        if summary["status"] != "interrupted":
            # The guide's `torch.save(model.state_dict(), ...)`: the final weights, loadable anywhere (the
            # average when EMA is on; spec.json's `weights` says which).
            atomic_torch_save(s.inference_model().state_dict(), self.run.model_file)
            if s.spec.input_kind == "image" and s.spec.num_classes <= 20:
                self._plot_predictions(s)
        atomic_write_json(self.run.summary_file, summary)
        plot_run(self.run.path)
        self.close()
        return summary

    def record(self, summary: dict[str, Any]) -> None:
        """summary.json alone, for a run that ends before `finish` can run (diverged, interrupted early):
        every run directory records how it ended."""
        atomic_write_json(self.run.summary_file, summary)
        self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def _plot_first_batch(self, s: TrainingSession) -> None:
        """plots/samples.png: what the model is fed (after augmentation), with labels."""
        from inceptionlab.plots import plot_samples  # matplotlib (~0.4 s): only when drawing

        s.train_loader.set_epoch(0)
        images, targets = next(iter(s.train_loader))
        labels = [s.spec.labels[int(t)] for t in targets[:32]]
        plot_samples(images[:32].cpu(), labels, self.run.plots / "samples.png")

    @torch.inference_mode()
    def _plot_predictions(self, s: TrainingSession) -> None:
        """plots/predictions.png: validation images with predicted label, confidence and truth, plus bars."""
        from inceptionlab.plots import plot_predictions  # matplotlib (~0.4 s): only when drawing

        images, targets = _spread_samples(s.splits.val, 15)
        model = s.inference_model().eval()
        with s.settings.autocast():
            logits = model(s.settings.prepare(images.to(s.device)))
        probs = s.task.probabilities(logits).cpu()
        plot_predictions(images.cpu(), probs, targets.cpu(), s.spec.labels, self.run.plots / "predictions.png")


class NoArtifacts:
    """Ranks other than 0: the same calls, nothing written."""

    def __init__(self, run: RunDir):
        self.run = run

    def start(self, s: TrainingSession, resumed_at: ResumePoint | None) -> None:
        pass

    def checkpoint(self, s: TrainingSession, point: ResumePoint, best: bool = False) -> None:
        pass

    def epoch(self, s: TrainingSession, row: dict[str, Any], confusion: torch.Tensor, point: ResumePoint, improved: bool) -> None:
        pass

    def finish(self, s: TrainingSession, summary: dict[str, Any]) -> dict[str, Any]:
        return {}

    def record(self, summary: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def open_artifacts(s: TrainingSession, out: Path, resume: Path | None) -> RunArtifacts | NoArtifacts:
    """The run directory: the resumed one, a new one under out/<recipe>/ (rank 0), or a no-op writer."""
    if resume is not None:
        run = RunDir.open(resume)
    elif s.dist.is_main:
        run = RunDir.create(out, s.recipe.name)
    else:
        run = RunDir(Path(out))
    return RunArtifacts(run) if s.dist.is_main else NoArtifacts(run)


def _spread_samples(dataset: Any, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` (image, label) pairs evenly spaced through a split: splits are often sorted by class."""
    picks = torch.linspace(0, len(dataset) - 1, min(count, len(dataset))).long().unique().tolist()
    if hasattr(dataset, "inputs"):  # an in-memory ArraySplit
        return dataset.inputs[picks], dataset.targets[picks]
    items = [dataset[i] for i in picks]
    items = [(torch.as_tensor(x), y) for x, y in items if x is not None]
    return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])
