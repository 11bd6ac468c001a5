"""`fit`: a recipe in, a run directory out. One helper per epoch phase; the per-step work is in `loop.py`.

Between epochs: evaluation, metrics rows, checkpoints (every epoch, atomic), best-model tracking,
early stopping, resume, Ctrl-C and NaN handling. Files are written by `artifacts` (rank 0 only).

A run that starts from weights measures where it starts: before its first step it validates them as
epoch 0 (a metrics row, the output, a checkpoint), and that score competes for best.pt. It never keeps
weights worse than that: when its last epoch scores below the start on train.best_metric, model.pt
(and the test split's score, the plots) take best.pt's weights instead, and the run says so. A
non-finite validation loss stops the run as diverged, as a non-finite training loss does; so does a finite
one that explodes (`exploded`): the run ends there, its summary says diverged, and model.pt holds the best
epoch's weights.
"""

from __future__ import annotations

import math
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from inceptionlab import hardware
from inceptionlab.checkpoint import ResumePoint, RunDir, load_checkpoint, restore_training, rng_state
from inceptionlab.config import Recipe
from inceptionlab.engine.artifacts import NoArtifacts, RunArtifacts, open_artifacts
from inceptionlab.engine.distributed import agree_at_log, broadcast_buffers, broadcast_state, gather_from_all
from inceptionlab.engine.finetune import Stage, Stages
from inceptionlab.engine.loop import EpochResult, NonFiniteLoss, evaluate, train_one_epoch
from inceptionlab.engine.optim import seek_schedule
from inceptionlab.engine.report import Reporter, chain, epoch_line, start_line
from inceptionlab.engine.resume import Change, apply_changes, refuse_finished, resume_changes
from inceptionlab.engine.session import TrainingSession, build_training_session
from inceptionlab.errors import UserError
from inceptionlab.models.weights import read_state_dict

DIVERGED_ADVICE = "try a lower optim.lr, train.precision=fp32 or train.grad_clip_norm=1.0"
# A finite validation loss has exploded when it is above EXPLODED x the lowest validation loss of the run so far
# AND above a uniform guess's (ln of the class count): the model then knows less than nothing about the
# classes. Issue 41's collapses went from 0.6 to 1e5 and 2.5e16 in one epoch. 10, not 4 (fastai's range-test
# factor): at 4 the suite's small fine-tunes (a head at lr 0.1 on 32 photos: 1.67 -> 15.7, 9.4x, then
# learning) stopped as diverged. It lets through EfficientNet-Lite0's whole model at lr 0.01 on 10
# tiny-imagenet classes, 0.45 -> 2.52 (5.5x) and top-1 0.855 -> 0.10 in one epoch: model.pt kept epoch 0
# there by the never-worse-than-the-start rule. Overfitting raises a validation loss by a small factor over
# many epochs, and an easy task's loss of 0.02 rising to 0.3 stays under ln(C) and goes on.
EXPLODED = 10.0


class StopSignal:
    """Set by Ctrl-C (or a test); the loop stops at its next log interval, a checkpoint is saved, the run exits."""

    def __init__(self) -> None:
        self.requested = False

    def request(self) -> None:
        self.requested = True


@contextmanager
def ctrl_c_requests_stop(stop: StopSignal, say: Callable[[str], None]) -> Iterator[None]:
    """First Ctrl-C: stop cleanly at the next log interval (`train.log_every`). Second: abort at once."""

    def handler(signum: int, frame: Any) -> None:
        if stop.requested:
            raise KeyboardInterrupt
        stop.request()
        say("stopping at the next log interval and saving a checkpoint (Ctrl-C again to abort)")

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass
class Outcome:
    run_dir: Path
    status: str  # completed | early_stopped | interrupted | diverged (a finite validation loss exploded)
    summary: dict[str, Any]


@dataclass
class BestTracker:
    metric: str
    value: float | None = None
    epoch: int | None = None
    stale_epochs: int = 0
    min_delta: float = 0.0
    summary: dict[str, Any] | None = None  # the evaluation of the best epoch
    start: float | None = None  # the starting weights' value (epoch 0), when the run validated them
    last: float | None = None  # the last epoch's value
    lowest_loss: float | None = None  # the lowest validation loss so far (the explosion rule's reference)

    @property
    def minimise(self) -> bool:
        return self.metric.endswith("loss")

    def update(self, value: float, epoch: int, summary: dict[str, Any]) -> bool:
        """Record the epoch's value; True when it is the best so far."""
        better = self.value is None or (
            value < self.value - self.min_delta if self.minimise else value > self.value + self.min_delta
        )
        if better:
            self.value, self.epoch, self.stale_epochs, self.summary = value, epoch, 0, summary
        else:
            self.stale_epochs += 1
        if epoch == 0:
            self.start = value
        self.last = value
        return better

    def saw_loss(self, loss: float) -> None:
        self.lowest_loss = loss if self.lowest_loss is None else min(self.lowest_loss, loss)

    def worse_than_start(self) -> bool:
        """The last epoch scored below the starting weights (strictly, without min_delta)."""
        if self.start is None or self.last is None:
            return False
        return self.last > self.start if self.minimise else self.last < self.start

    def state(self) -> dict[str, Any]:
        return {"value": self.value, "epoch": self.epoch, "stale_epochs": self.stale_epochs, "start": self.start,
                "last": self.last, "lowest_loss": self.lowest_loss}

    def load(self, point: ResumePoint) -> None:
        self.value, self.epoch, self.stale_epochs = point.best["value"], point.best["epoch"], point.best["stale_epochs"]
        self.start, self.last = point.best.get("start"), point.best.get("last")
        self.lowest_loss = point.best.get("lowest_loss")
        self.summary = point.best_summary

    def point(self, epoch: int, step: int) -> ResumePoint:
        return ResumePoint(epoch, step, self.state(), self.summary)


@dataclass
class _Run:
    """One fit call's moving parts, so each phase helper takes one argument."""

    s: TrainingSession
    artifacts: RunArtifacts | NoArtifacts
    report: Reporter
    best: BestTracker
    stop: StopSignal
    on_log: Callable[[int, float], None] | None
    status: str = "completed"
    last: dict[str, Any] | None = None  # the last epoch's evaluation summary
    lr: dict[str, float] | None = None  # each part's rate at the epoch's first step
    stages: Stages | None = None  # what each epoch trains (engine/finetune.py)


def fit(recipe: Recipe, out: Path = Path("runs"), resume: Path | None = None, *, progress: bool | None = None,
        stop: StopSignal | None = None, on_log: Callable[[int, float], None] | None = None) -> Outcome:
    """Train `recipe`; returns where the run is and how it ended. Raises UserError on bad input.

    With `resume`, the recipe's differences from the checkpoint's are checked first (engine/resume.py):
    one the checkpoint cannot take is refused before the session is built or anything is written."""
    resumed = _checked_resume(recipe, resume) if resume is not None else None
    try:
        s = build_training_session(recipe)
    except KeyboardInterrupt:
        raise UserError("interrupted while reading the data and building the model, before the run directory "
                        "was made: nothing was written", exit_code=130) from None
    with hardware.gpu_settings(hardware.device_facts(s.device), s.recipe.train.precision, recipe.train.deterministic):
        return _fit(s, recipe, out, resume, progress, stop, on_log, resumed)


@dataclass
class _Resumed:
    ckpt: dict[str, Any]
    changes: list[Change]


def _checked_resume(recipe: Recipe, resume: Path) -> _Resumed:
    run = RunDir.open(resume)
    _check_resumable(run)  # a plain word on a run stopped before its first checkpoint, not "not found"
    ckpt = load_checkpoint(run.last)
    changes = resume_changes(ckpt, recipe, resume)
    refuse_finished(ckpt, recipe, resume)
    return _Resumed(ckpt, changes)


def _check_resumable(run: RunDir) -> None:
    if not run.last.is_file():
        raise UserError(f"{run.path}: no checkpoint to resume (the run stopped before its first checkpoint was "
                        f"saved); start it again: inceptionlab train {run.path / 'recipe.resolved.yaml'}")


def _fit(s: TrainingSession, recipe: Recipe, out: Path, resume: Path | None, progress: bool | None,
         stop: StopSignal | None, on_log: Callable[[int, float], None] | None, resumed: _Resumed | None = None) -> Outcome:
    r = _Run(s, open_artifacts(s, out, resume), Reporter(s.dist.is_main, progress),
             BestTracker(recipe.train.best_metric, min_delta=recipe.train.early_stop_min_delta), stop or StopSignal(), on_log)
    r.stages = Stages(s, s.wrap, r.report.say)
    try:
        start = _start(r, resumed)
        if resumed is None and s.pretrained is not None:
            _validate_start(r, r.stages.for_epoch(0))
    except KeyboardInterrupt:
        # The first batch is drawn here (plots/samples.png): with workers or a big folder this is where
        # the data is decoded, before Ctrl-C requests a clean stop (the handler below is not set yet).
        raise _interrupted_early(r, "while preparing the data") from None
    wall_start = time.perf_counter()
    with ctrl_c_requests_stop(r.stop, r.report.say):
        for epoch in range(start.epoch, recipe.train.epochs):
            first_step = start.step_in_epoch if epoch == start.epoch else 0
            stage = r.stages.for_epoch(epoch)
            result, steps_in_epoch = _train_epoch(r, epoch, first_step, stage)
            if _stopped_mid_epoch(r, epoch, first_step + result.steps, steps_in_epoch, result):
                break
            if not _validate(r, epoch + 1, result, stage) or _should_end(r, epoch + 1, result):
                break
    return Outcome(r.artifacts.run.path, r.status, _finish(r, time.perf_counter() - wall_start))


def _start(r: _Run, resumed: _Resumed | None) -> ResumePoint:
    """Restore a resumed run's state (or start at epoch 0) and apply the values changed on resume, then
    write the run's first files (recipe.resolved.yaml: only once the resume has succeeded), say where it is."""
    start = ResumePoint(0, 0, r.best.state(), None)
    if resumed is not None:
        start = restore_training(resumed.ckpt, r.s.resumable_parts(), r.s.spec.class_names, r.s.dist.rank,
                                 r.s.device)
        applied = apply_changes(resumed.changes, r.s.optimizer, r.s.scheduler)
        r.best.load(start)
        r.report.say(f"resuming {r.artifacts.run.path} at epoch {start.epoch + 1}, step {start.step_in_epoch}")
        for change in applied:
            r.report.say(f"resume: {change}")
    r.artifacts.start(r.s, start if resumed is not None else None)
    for note in r.s.notes:
        if resumed is not None and note in r.s.weights_notes:  # a resumed run's weights are its checkpoint's
            continue
        r.report.say(note)
    if resumed is not None:
        r.report.say(f"weights: resumed from {r.artifacts.run.last}")
    if r.s.threads is not None:
        r.s.threads.say = r.report.say  # a change of thread count is said where progress is
    r.report.say(f"run directory: {r.artifacts.run.path}")
    return start


def _train_epoch(r: _Run, epoch: int, first_step: int, stage: Stage) -> tuple[EpochResult, int]:
    """One epoch's training steps from `first_step` on; returns the result and the epoch's step count."""
    s, epochs = r.s, r.s.recipe.train.epochs
    stage.train_loader.set_epoch(epoch, start=first_step * s.recipe.train.batch_size)
    steps_in_epoch = first_step + len(stage.train_loader)
    loader = _governed(r.report.wrap(stage.train_loader, epoch + 1, epochs, first_step), s.threads)
    log = chain(r.report.on_log(epoch + 1, epochs, steps_in_epoch), r.on_log)
    # The schedule counts the image loader's steps; this epoch's loader may have another count (engine/optim.py).
    seek_schedule(s.scheduler, epoch * s.steps_per_epoch + first_step)
    r.lr = _rates(s)
    try:
        return train_one_epoch(stage.runner, loader, s.task, s.optimizer, s.scaler, stage.settings,
                               first_step=first_step, on_log=log,
                               agree=lambda loss: agree_at_log(loss, r.stop.requested, s.dist, s.device),
                               after_step=s.after_step, train_mode=stage.train_mode, epoch=epoch), steps_in_epoch
    except NonFiniteLoss as exc:
        raise _diverged(r, f"training diverged in epoch {epoch + 1}: {exc}") from None
    finally:
        r.report.close_bar()


def _diverged(r: _Run, what: str, advice: str = DIVERGED_ADVICE) -> UserError:
    """A NaN or infinite loss (training or validation): record the run as diverged, say what is kept."""
    last = r.artifacts.run.last
    kept = (f"kept the last good checkpoint, {last}" if last.is_file() else
            "no checkpoint was saved (that happens at the end of each epoch)")
    r.artifacts.record(_summary(r, "diverged", 0.0))
    return UserError(f"{what}; {kept}; {advice}", exit_code=3)


def _governed(batches: Iterator[Any], governor: hardware.ThreadGovernor | None) -> Iterator[Any]:
    """The batches, torch's thread pool re-sized before each step (the governor samples at most every
    couple of seconds), so a process that starts beside the run costs it seconds, not an interval."""
    for batch in batches:
        if governor is not None:
            governor.update()
        yield batch


def _stopped_mid_epoch(r: _Run, epoch: int, done: int, steps_in_epoch: int, result: EpochResult) -> bool:
    """A stop before the epoch's last step: save where we are (epoch, step) for --resume."""
    if not result.stopped or done >= steps_in_epoch:
        return False
    r.artifacts.checkpoint(r.s, _resume_point(r, epoch, done))
    r.report.say(f"stopped at epoch {epoch + 1} step {done}; resume with: inceptionlab train --resume {r.artifacts.run.path}")
    r.status = "interrupted"
    return True


def _rates(s: TrainingSession) -> dict[str, float]:
    """Each part's rate now (the first group of each: head, aux, body)."""
    rates: dict[str, float] = {}
    for group in s.optimizer.param_groups:
        rates.setdefault(group.get("part", "head"), group["lr"])
    return rates


def _validate(r: _Run, epoch: int, result: EpochResult, stage: Stage) -> bool:
    """Evaluate, then record the epoch: metrics row, best tracking, checkpoints, the epoch line. False when
    the validation loss exploded: the run ends as diverged, the epoch unrecorded (last.pt the last good one)."""
    s = r.s
    if s.threads is not None:
        s.threads.update()  # the load may have changed during the epoch
    val = evaluate(stage.runner if stage.name != "head-features" else stage.view(s.model), stage.val_loader, s.task,
                   stage.settings)
    raw = None
    if s.ema is not None:  # the averaged weights are the run's; the trained ones are scored beside them
        broadcast_buffers(s.ema.module, s.dist)  # every rank scores and keeps rank 0's average
        raw, val = val, evaluate(stage.view(s.ema.module), stage.val_loader, s.task, stage.settings)
    _check_finite(r, epoch, val, raw)
    if exploded(val["loss"], r.best.lowest_loss, len(s.spec.class_names)):
        r.status = "diverged"
        r.report.say(f"diverged: the validation loss after epoch {epoch} is {val['loss']:.4g}, over {EXPLODED:g}x the "
                     f"lowest so far ({r.best.lowest_loss:.4g}) and over a uniform guess's; the run stops here "
                     f"(val_top1 {val['top1']:.4f}, not recorded); {DIVERGED_ADVICE}")
        return False
    row = _epoch_row(epoch, s, result, val, r.lr or {}, raw)
    _record(r, epoch, row, val)
    unit = "img/s" if s.spec.input_kind == "image" else "samples/s"  # metrics.jsonl keeps its images_per_s key
    r.report.say(epoch_line(row, s.recipe.train.epochs, s.train_loader.skipped + s.val_loader.skipped, unit))
    return True


def exploded(loss: float, lowest: float | None, classes: int) -> bool:
    """A finite validation loss far above the run's lowest and above a uniform guess's (EXPLODED says why)."""
    return lowest is not None and loss > max(EXPLODED * lowest, math.log(max(classes, 2)))


def _validate_start(r: _Run, stage: Stage) -> None:
    """Epoch 0: the starting weights scored before the first step, recorded as an epoch is, competing for
    best.pt. The average (EMA) is a copy of them here, so it is scored once and stands for both."""
    s = r.s
    model = s.inference_model()
    val = evaluate(stage.view(model) if stage.name == "head-features" else model, stage.val_loader, s.task,
                   stage.settings)
    _check_finite(r, 0, val, None)
    row = _start_row(s, val)
    _record(r, 0, row, val)
    r.report.say(start_line(row, s.recipe.train.epochs))


def _record(r: _Run, epoch: int, row: dict[str, Any], val: dict[str, Any]) -> None:
    """The epoch's row, its best tracking (when the row holds the metric: epoch 0 has no training figures),
    last.pt and best.pt, confusion.csv."""
    s = r.s
    r.last = _eval_summary(epoch, s, val)
    metric = r.best.metric
    r.best.saw_loss(float(val["loss"]))
    improved = metric in row and r.best.update(float(row[metric]), epoch, r.last)  # a valid key: engine/choices.py
    r.artifacts.epoch(s, row, val["confusion"], _resume_point(r, epoch, 0), improved)


def _check_finite(r: _Run, epoch: int, val: dict[str, Any], raw: dict[str, Any] | None) -> None:
    """A NaN or infinite validation loss (of the average or of the trained weights) stops the run as diverged,
    before the epoch is recorded: last.pt stays the last good one."""
    bad = next((scored["loss"] for scored in (val, raw) if scored is not None and not math.isfinite(scored["loss"])),
               None)
    if bad is None:
        return
    if epoch == 0:
        raise _diverged(r, f"the starting weights (model.weights={r.s.recipe.model.weights}) score a validation loss "
                           f"of {bad}", "check that the file holds this model's trained weights")
    raise _diverged(r, f"training diverged in epoch {epoch}: the validation loss after epoch {epoch} is {bad}")


def _resume_point(r: _Run, epoch: int, step: int) -> ResumePoint:
    """Where training stands, with every rank's RNG state for the checkpoint (checkpoint.py says why).
    A collective under DDP: every rank gets here at the same point of the loop."""
    return replace(r.best.point(epoch, step), rng_by_rank=gather_from_all(rng_state(r.s.device), r.s.dist))


def _should_end(r: _Run, epoch: int, result: EpochResult) -> bool:
    """A stop asked for during the epoch's last step, or early stopping."""
    patience = r.s.recipe.train.early_stop_patience
    if result.stopped:
        r.status = "interrupted"
        r.report.say(f"stopped after epoch {epoch}; resume with: inceptionlab train --resume {r.artifacts.run.path}")
    elif patience and r.best.stale_epochs >= patience:
        r.status = "early_stopped"
        r.report.say(f"early stop: {r.best.metric} has not improved for {r.best.stale_epochs} epochs")
    return r.status != "completed"


def _finish(r: _Run, seconds: float) -> dict[str, Any]:
    """Keep the weights the run ends with (never worse than its start), score the test split with them (all
    ranks: evaluation all-reduces), then write model.pt, summary.json and plots (rank 0)."""
    s, test, kept = r.s, None, {}
    if r.status != "interrupted":
        kept = {"model_epoch": _kept_epoch(r)}
    if r.status != "interrupted" and s.test_loader is not None:
        scored = evaluate(s.inference_model(), s.test_loader, s.task, s.settings)
        test = {**_eval_summary(0, s, scored), "samples": scored["samples"]}  # once, at the end: the test split
        test.pop("epoch")
    summary = {**_summary(r, r.status, seconds), **kept, **({"test": test} if test else {})}
    return r.artifacts.finish(s, summary)


def _kept_epoch(r: _Run) -> int | None:
    """The epoch whose weights the run keeps: the last, unless it scored below the starting weights; then the
    best epoch's (best.pt, the start among the candidates), loaded into the model the run saves and said."""
    best = r.best
    last_epoch = r.last["epoch"] if r.last else None
    if r.status == "diverged" and best.epoch is not None:  # the model holds the exploded epoch's weights
        _load_best(r)
        r.report.say(f"model.pt: the weights of epoch {best.epoch} ({best.metric} {best.value:.4f}), the best before "
                     "the validation loss exploded")
        return best.epoch
    if not best.worse_than_start() or best.epoch is None or best.epoch == last_epoch:
        return last_epoch
    _load_best(r)
    metric = best.metric
    r.report.say(f"model.pt: the weights of epoch {best.epoch} ({metric} {best.value:.4f}), not the last epoch's "
                 f"({best.last:.4f}), which scored below the starting weights ({best.start:.4f} at epoch 0)")
    return best.epoch


def _load_best(r: _Run) -> None:
    """best.pt's weights into the model the run saves and scores."""
    s = r.s
    if s.dist.is_main:
        s.inference_model().load_state_dict(read_state_dict(r.artifacts.run.best)[0])
    broadcast_state(s.inference_model(), s.dist)  # every rank scores the test split with rank 0's file


def _interrupted_early(r: _Run, when: str) -> UserError:
    """Ctrl-C before fit's own handler could stop the run cleanly: say so, record it, say what to do."""
    r.artifacts.record(_summary(r, "interrupted", 0.0))
    run = r.artifacts.run
    if run.last.is_file():
        return UserError(f"interrupted {when}; resume with: inceptionlab train --resume {run.path}", exit_code=130)
    return UserError(f"interrupted {when}, before the first checkpoint: {run.path} holds no checkpoint to resume; "
                     f"start it again: inceptionlab train {run.path / 'recipe.resolved.yaml'}", exit_code=130)


def _summary(r: _Run, status: str, seconds: float) -> dict[str, Any]:
    """summary.json's fields (every run records its status, however it ended)."""
    s = r.s
    return {
        "status": status,
        "recipe": s.recipe.name,
        "run_dir": str(r.artifacts.run.path),
        "best_metric": r.best.metric,
        "best": r.best.summary,
        "last": r.last,
        "epochs_done": r.last["epoch"] if r.last else None,
        "wall_seconds": seconds,
        "skipped_files": s.skipped_files,
        "skipped_reasons": {str(path): getattr(path, "problem", "") for path in s.skipped_files},
        **({"features": r.stages.feature_summary()} if r.stages is not None and r.stages.features else {}),
    }


def _epoch_row(epoch: int, s: TrainingSession, result: EpochResult, val: dict[str, Any], lr: dict[str, float],
               raw: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "epoch": epoch,
        "train_loss": result.metrics["loss"],
        "train_top1": result.metrics["top1"],
        "val_loss": val["loss"],
        "val_top1": val["top1"],
        **({"val_top5": val["top5"]} if "top5" in val else {}),
        **({f"val_raw_{k}": raw[k] for k in ("loss", "top1", "top5") if k in raw} if raw is not None else {}),
        "lr": lr.get("head", 0.0),
        **({"lr_body": lr["body"]} if "body" in lr else {}),
        "images_per_s": result.images_per_s * s.dist.world_size,  # each epoch's first step left out
        "epoch_seconds": result.seconds,
        "val_seconds": val["seconds"],
        "samples": result.samples * s.dist.world_size,  # padded shards repeat a few train samples
        "val_samples": val["samples"],  # unpadded shards: every val image exactly once
    }


def _start_row(s: TrainingSession, val: dict[str, Any]) -> dict[str, Any]:
    """Epoch 0's metrics row: the starting weights' validation, no training figures. With EMA the average is
    a copy of the weights at this point: val_raw_* are the same numbers (so either may pick best.pt)."""
    scores = {"val_loss": val["loss"], "val_top1": val["top1"], **({"val_top5": val["top5"]} if "top5" in val else {})}
    raw = {key.replace("val_", "val_raw_"): value for key, value in scores.items()} if s.ema is not None else {}
    return {"epoch": 0, **scores, **raw, "val_seconds": val["seconds"], "val_samples": val["samples"]}


def _eval_summary(epoch: int, s: TrainingSession, val: dict[str, Any]) -> dict[str, Any]:
    per_class = {label: acc for label, acc in zip(s.spec.labels, val["per_class"])}
    summary = {"epoch": epoch, "loss": val["loss"], "top1": val["top1"], "top5": val.get("top5"), "per_class": per_class}
    return {k: v for k, v in summary.items() if v is not None}
