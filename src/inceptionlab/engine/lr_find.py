"""The learning-rate range test (Smith 2017, "Cyclical Learning Rates"; fastai's and Lightning's lr_find).

From a run's starting weights, train a few steps with the rate rising exponentially from `start` to
`end`, one rate per step, and record the loss. Two tests, because the head and the body want different
rates:

- **head**: the body frozen as in the head-only epochs (engine/finetune.py), only the head trains, on
  the same data path: the body's features computed once and cached (engine/features.py), so each step
  is the head's alone and the run that follows reads them from the cache; through the frozen body
  when the model's head cannot be split off exactly or finetune.feature_cache=false;
- **body**: the whole model at one rate.

The loss is smoothed as fastai and Lightning do (an exponential moving average with beta 0.98,
bias-corrected), and a test stops when it has diverged: the smoothed loss over 4x its best (their rule),
or the loss itself over 4x the best smoothed loss for 3 steps in a row. The second is ours: beta 0.98
remembers ~50 steps, so in a test of 60 steps the smoothed loss is close to the mean of everything so
far, and a resnet18 body whose loss blew up to 4-10 (from 1.1, chance for 3 classes) in the last third
moved it only from 1.09 to ~3.7: the first rule never fired and the test ran on to lr 10.

The suggestion of each is the rate where the smoothed loss falls fastest against log10(rate), over the
steps after the first 10% (their noise dominates) and before the smoothed loss's minimum: Lightning's
steepest descent, kept to the falling part of the curve as ignite's FastaiLRFinder.lr_suggestion keeps
it. Lightning's looks at the whole curve, and took a dip inside a blown-up loss (1.54, past the
minimum at ~1e-3) for the steepest descent. The recipe values that follow: optim.lr = the head's
suggestion, and finetune.body_lr_mult = body's / head's, capped at 1 (and said when capped). The
model's weights, BatchNorm statistics and the process's RNG streams are restored afterwards: the range
test leaves no trace on the run.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import numpy as np
import torch

from inceptionlab.engine import batchnorm
from inceptionlab.engine import features as feature_cache
from inceptionlab.engine.loop import StepSettings, train_step
from inceptionlab.engine.optim import build_optimizer

if TYPE_CHECKING:
    from inceptionlab.engine.session import TrainingSession

SMOOTHING = 0.98
DIVERGED = 4.0  # the smoothed loss over its best by this factor ends the test (fastai's and Lightning's 4)
# ... and so does the loss itself over DIVERGED x the best smoothed loss this many steps in a row: one step
# over it is noise (a batch of 4 images with one confident miss), three are a loss that has left its best.
DIVERGED_STEPS = 3
SKIP_START = 0.10  # of the steps, left out of the suggestion and of the divergence checks
RULE = ("steepest descent of the smoothed loss against log10(lr), after the first 10% of steps and before "
        "the smoothed loss's minimum (Lightning's suggestion, kept to the falling part as ignite's)")


@dataclass
class RangeTest:
    part: str  # head | body
    lrs: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    smoothed: list[float] = field(default_factory=list)
    suggestion: float | None = None
    ended: str = ""  # why the test stopped

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rule": RULE}


def rates(start: float, end: float, steps: int) -> list[float]:
    """`steps` rates rising exponentially from start to end."""
    return [start * (end / start) ** (k / max(1, steps - 1)) for k in range(steps)]


def range_test(step: Callable[[float], float], lrs: list[float], part: str = "",
               progress: Callable[[Any], Any] = lambda it: it) -> RangeTest:
    """Call `step(lr)` (one optimizer step at that rate, returning its loss) for each rate until the loss
    diverges. `progress` wraps the rates (a tqdm bar): each rate is drawn from it as its step runs."""
    stepping = progress(lrs)
    try:
        return _range_test(step, stepping, lrs, part)
    finally:
        close = getattr(stepping, "close", None)  # a bar or generator left early (divergence)
        if close is not None:
            close()


def _range_test(step: Callable[[float], float], stepping: Iterable[float], lrs: list[float], part: str) -> RangeTest:
    result = RangeTest(part)
    watch_from = max(2, int(len(lrs) * SKIP_START))  # Lightning waits 2 steps; the first 10% are noise
    average, best, above = 0.0, math.inf, 0
    for k, lr in enumerate(stepping):
        loss = step(lr)
        result.lrs.append(lr)
        result.losses.append(loss)
        if not math.isfinite(loss):
            result.ended = f"loss {loss} at lr {lr:.3g}"
            break
        average = SMOOTHING * average + (1 - SMOOTHING) * loss
        smoothed = average / (1 - SMOOTHING ** (k + 1))
        result.smoothed.append(smoothed)
        best = min(best, smoothed)
        above = above + 1 if loss > DIVERGED * best else 0
        if k >= watch_from and smoothed > DIVERGED * best:
            result.ended = f"diverged at lr {lr:.3g} (smoothed loss {smoothed:.3g} > {DIVERGED:g} x best {best:.3g})"
            break
        if k >= watch_from and above >= DIVERGED_STEPS:
            result.ended = (f"diverged at lr {lr:.3g} (loss > {DIVERGED:g} x best smoothed {best:.3g} for "
                            f"{DIVERGED_STEPS} steps)")
            break
    result.ended = result.ended or f"reached lr {lrs[-1]:.3g}"
    result.suggestion = suggest(result.lrs[: len(result.smoothed)], result.smoothed)
    return result


def suggest(lrs: list[float], smoothed: list[float]) -> float | None:
    """The rate at the steepest descent of `smoothed` over log10(lr) between the first 10% of the steps and
    the curve's minimum (see RULE); None if it never falls there."""
    begin = max(1, int(len(smoothed) * SKIP_START))
    lowest = int(np.argmin(smoothed)) if smoothed else 0  # past it the loss has started to rise
    falling = np.asarray(smoothed[begin: lowest + 1], dtype=float)
    if falling.size < 3:  # the minimum within the first steps: the loss never fell after them
        return None
    slopes = np.gradient(falling, np.log10(np.asarray(lrs[begin: begin + falling.size])))[1:-1]  # central only
    index = int(np.argmin(slopes))
    return float(lrs[begin + 1 + index]) if slopes[index] < 0 else None


def _batches(loader: Any) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1


@dataclass
class _DataPath:
    """What one part's steps call, on what batches, with which settings, entering which mode."""

    runner: torch.nn.Module
    loader: Any
    settings: StepSettings
    train_mode: Callable[[torch.nn.Module], Any]


def _data_path(s: TrainingSession, part: str, say: Callable[[str], None]) -> _DataPath:
    """The head-only epochs' path for the head (cached features when exact and allowed, else through the
    frozen body: eval mode, statistics kept); the whole model on images for the body."""
    if part == "head" and s.recipe.finetune.feature_cache is not False and not feature_cache.allowed(s.recipe):
        say(feature_cache.augmented_line(s.recipe))
    elif part == "head" and s.recipe.finetune.feature_cache is not False:
        head_name = feature_cache.exact_head(s)
        if head_name is None:
            say(feature_cache.not_used_line(s))
        else:
            cached = feature_cache.compute_features(s, head_name)
            say(feature_cache.describe_range_test(cached))
            head = s.model.get_submodule(head_name)
            train, _ = feature_cache.feature_loaders(s, cached)
            return _DataPath(s.wrap(head), train, feature_cache.feature_settings(s), torch.nn.Module.train)
    if part == "body":  # the whole-model epochs' mode: BatchNorm as finetune.bn says (frozen from trained weights)
        policy, apart = s.recipe.finetune.bn, (*s.parts.head_modules, *s.parts.aux_modules)

        def whole(runner: torch.nn.Module) -> None:
            runner.train()
            batchnorm.apply_policy(policy, s.model, apart)

        return _DataPath(s.wrap(s.model), s.train_loader, s.settings, whole)
    heads = [s.model.get_submodule(n) for n in s.parts.head_modules]

    def head_only(runner: torch.nn.Module) -> None:  # the frozen body's policy: eval mode, statistics kept
        runner.eval()
        for module in heads:
            module.train()

    return _DataPath(s.wrap(s.model), s.train_loader, s.settings, head_only)


def session_range_test(s: TrainingSession, part: str, lrs: list[float],
                       progress: Callable[[Any], Any] = lambda it: it,
                       say: Callable[[str], None] = lambda line: None) -> RangeTest:
    """The range test of one part (head: body frozen; body: the whole model) on the session's model."""
    head = set(s.parts.head)
    for name, param in s.model.named_parameters():
        param.requires_grad_(part == "body" or name in head)
    path = _data_path(s, part, say)
    trainable = [p for p in s.model.parameters() if p.requires_grad]
    optimizer = build_optimizer(trainable, replace(s.recipe.optim, lr=lrs[0]))
    scaler = torch.amp.GradScaler(s.device.type, enabled=s.recipe.train.precision == "fp16")
    batches = _batches(path.loader)

    def step(lr: float) -> float:
        for group in optimizer.param_groups:
            group["lr"] = lr
        path.train_mode(path.runner)
        inputs, targets = path.settings.to_device(*next(batches))
        loss, _ = train_step(path.runner, s.task, optimizer, scaler, path.settings, inputs, targets)
        return float(loss)

    return range_test(step, lrs, part, progress)


def body_never_trains(recipe: Any) -> bool:
    """A linear probe: the body's rate is 0 for the whole run."""
    return recipe.finetune.body_lr_mult == 0


def find_learning_rates(s: TrainingSession, start: float = 1e-7, end: float = 10.0, steps: int = 100,
                        progress: Callable[[Any], Any] = lambda it: it,
                        say: Callable[[str], None] = lambda line: None) -> dict[str, RangeTest]:
    """Both range tests; the model, its statistics and the RNG streams are as before afterwards."""
    saved = copy.deepcopy(s.model.state_dict())
    devices = [s.device] if s.device.type == "cuda" else []
    results = {}
    parts = ("head", "body")
    if body_never_trains(s.recipe):
        parts = ("head",)
        say("body: not tested: finetune.body_lr_mult=0 keeps the body frozen for the whole run (a linear probe); "
            "set finetune.body_lr_mult (and finetune.freeze_epochs) to test the whole model too")
    try:
        with torch.random.fork_rng(devices=devices):
            for part in parts:
                results[part] = session_range_test(s, part, rates(start, end, steps), progress, say)
                s.model.load_state_dict(saved)
    finally:
        s.model.load_state_dict(saved)
        for param in s.model.parameters():
            param.requires_grad_(True)
    return results


@dataclass
class Recommendation:
    values: dict[str, float]  # recipe key -> value (optim.lr, finetune.body_lr_mult)
    notes: list[str]  # what was decided beyond the two suggestions (a cap), for the user to read


def recommendation(results: dict[str, RangeTest]) -> Recommendation:
    """optim.lr from the head's test, finetune.body_lr_mult from the body's (at most 1, said when capped)."""
    head = results["head"].suggestion
    body = results["body"].suggestion if "body" in results else None
    values: dict[str, float] = {}
    notes: list[str] = []
    if head is not None:
        values["optim.lr"] = head
    if head is not None and body is not None:
        ratio = body / head
        values["finetune.body_lr_mult"] = min(1.0, ratio)
        if ratio > 1:
            notes.append(f"finetune.body_lr_mult capped at 1: the whole model's suggestion ({body:.3g}) is "
                         f"{ratio:.2g}x the head's ({head:.3g}), and a pretrained body never trains faster than "
                         f"its new head here; look at both curves in the plot before using either rate")
    elif body is not None:
        values["optim.lr"] = body
        notes.append(f"optim.lr from the whole model's test ({body:.3g}): the head's loss never fell in its test")
    return Recommendation(values, notes)
