"""Fine-tuning stages: the head alone with the body frozen, then the whole model.

A stage is what an epoch trains: the module the loop calls, its loaders, how it enters training mode.

- `all`: the whole model, as the guide trains it; its BatchNorm layers as `finetune.bn` says
  (engine/batchnorm.py: batch statistics, or the running ones kept).
- `head` (epochs before finetune.freeze_epochs, or every epoch with finetune.body_lr_mult=0: a body at
  rate 0 is a frozen body): only the head's parameters require gradients, so
  autograd computes none for the body and auxiliary heads (no activations kept for their backward),
  and the model runs in eval mode but for the head: BatchNorm keeps and uses its running statistics and
  dropout in the body is off. A frozen body that still updated its BatchNorm statistics would not be
  frozen, and the features it hands the head would drift.
- `head-features`: the same function, computed once (engine/features.py): the head trains on the
  body's cached features.

Under DDP a wrapper's set of parameters that require gradients is fixed when it is built: its reducer
expects exactly those gradients (toggling `requires_grad` on a wrapped model mid-run makes ranks
diverge or hang, Lightning #20340). So each stage builds its own wrapper, on every rank at the same
epoch boundary (the stage is a function of the epoch), after setting `requires_grad` on the plain
model; the previous wrapper is dropped. A resumed run starts in the stage of its epoch, so resume
is exact across the unfreeze. The optimizer holds every parameter from the start: a frozen one has no
gradient, so the optimizer leaves it, its weight decay and its state untouched until it unfreezes.
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from torch import nn

from inceptionlab.engine import batchnorm
from inceptionlab.engine import features as feature_cache
from inceptionlab.engine.loop import StepSettings

if TYPE_CHECKING:
    from inceptionlab.engine.session import TrainingSession

log = logging.getLogger(__name__)


@dataclass
class Stage:
    name: str  # all | head | head-features
    runner: nn.Module  # what the loop calls (maybe DDP- and/or compile-wrapped)
    train_loader: Any
    val_loader: Any
    settings: StepSettings
    train_mode: Callable[[nn.Module], Any]
    view: Callable[[nn.Module], nn.Module]  # a whole model (raw or averaged) -> what evaluation calls


class Stages:
    """The stage of each epoch, built when the epoch needs a different one than the last."""

    def __init__(self, s: TrainingSession, wrap: Callable[[nn.Module], nn.Module], say: Callable[[str], None]):
        self.s, self.wrap, self.say = s, wrap, say
        self.current: Stage | None = None
        self.features: feature_cache.Features | None = None
        self._exact: bool | None = None  # the fast path's check, once per run

    def feature_summary(self) -> dict[str, Any]:
        """What the cached features cost (summary.json): seconds, images through the body, where they are."""
        f = self.features
        assert f is not None
        return {"seconds": round(f.seconds, 3), "images_computed": f.images, "loaded_from_cache": f.loaded,
                "train": len(f.train), "val": len(f.val), "dim": int(f.train.inputs.shape[1]), "cache": str(f.cached)}

    @property
    def head_epochs(self) -> int:
        """Epochs that train the head alone: all of them with the body at rate 0, else the freeze's."""
        tune, epochs = self.s.recipe.finetune, self.s.recipe.train.epochs
        return epochs if tune.body_lr_mult == 0 else min(tune.freeze_epochs, epochs)

    def kind(self, epoch: int) -> str:
        s = self.s
        if epoch >= self.head_epochs:
            return "all"
        return "head-features" if feature_cache.allowed(s.recipe) and self._exact is not False else "head"

    def for_epoch(self, epoch: int) -> Stage:
        kind = self.kind(epoch)
        if self.current is not None and self.current.name == kind:
            return self.current
        if kind == "head-features":
            stage = self._features_stage()
            if stage is None:  # not exact for this model: through the frozen body instead
                kind = "head"
        if kind != "head-features":
            stage = self._model_stage(kind)
        self.current = stage
        return stage

    def _set_trainable(self, kind: str) -> None:
        head = set(self.s.parts.head)
        for name, param in self.s.model.named_parameters():
            param.requires_grad_(kind == "all" or name in head)

    def _release(self) -> None:
        """Drop the previous stage's wrapper (its DDP reducer holds hooks on the parameters)."""
        if self.current is not None:
            self.current = None
            gc.collect()

    def _model_stage(self, kind: str) -> Stage:
        s = self.s
        self._release()
        self._set_trainable(kind)
        runner = self.wrap(s.model)
        if kind == "head" and s.recipe.finetune.feature_cache is not False and not feature_cache.allowed(s.recipe):
            self.say(feature_cache.augmented_line(s.recipe))
        self._say_stage(kind)
        return Stage(kind, runner, s.train_loader, s.val_loader, s.settings, self._train_mode(kind), _whole)

    def _say_stage(self, kind: str) -> None:
        """The stage's policy, stated: what trains, what is frozen, what BatchNorm does."""
        s, tune = self.s, self.s.recipe.finetune
        if kind == "head" and tune.body_lr_mult == 0:
            self.say(f"epochs 1-{self.head_epochs}: the head ({', '.join(s.parts.head_modules)}) trains alone; "
                     "the body is frozen for the whole run (finetune.body_lr_mult=0: no gradients, BatchNorm "
                     "statistics kept, eval mode)")
        elif kind == "head":
            self.say(f"epochs 1-{self.head_epochs}: the head ({', '.join(s.parts.head_modules)}) trains alone; "
                     "the body is frozen (no gradients, BatchNorm statistics kept, eval mode)")
        elif tune.freeze_epochs or (tune.bn != "train" and batchnorm.has_batchnorm(s.model)):
            where = f"epoch {tune.freeze_epochs + 1}: the whole model trains from here" if tune.freeze_epochs else \
                "the whole model trains"
            self.say(where + (f" ({batchnorm.describe(tune.bn)})" if batchnorm.has_batchnorm(s.model) else ""))

    def _train_mode(self, kind: str) -> Callable[[nn.Module], Any]:
        if kind == "all":
            policy, apart = self.s.recipe.finetune.bn, (*self.s.parts.head_modules, *self.s.parts.aux_modules)

            def whole(runner: nn.Module) -> None:
                runner.train()
                batchnorm.apply_policy(policy, self.s.model, apart)

            return whole
        heads = [self.s.model.get_submodule(name) for name in self.s.parts.head_modules]

        def head_only(runner: nn.Module) -> None:
            runner.eval()
            for head in heads:
                head.train()

        return head_only

    def _features_stage(self) -> Stage | None:
        s = self.s
        head_name = s.parts.head_modules[0]
        if self.features is None:
            if feature_cache.exact_head(s) is None:
                self._exact = False
                self.say(feature_cache.not_used_line(s))
                return None
            self._exact = True
            self.features = feature_cache.compute_features(s, head_name)
            self.say(feature_cache.describe_cost(self.features, self.head_epochs))
        self._release()
        self._set_trainable("head")
        self._say_stage("head")
        head = s.model.get_submodule(head_name)
        runner = head if not s.dist.enabled else nn.parallel.DistributedDataParallel(
            head, device_ids=[s.device.index] if s.device.type == "cuda" else None)
        train_loader, val_loader = feature_cache.feature_loaders(s, self.features)
        return Stage("head-features", runner, train_loader, val_loader, feature_cache.feature_settings(s),
                     nn.Module.train,
                     lambda model: model.get_submodule(head_name))


def _whole(model: nn.Module) -> nn.Module:
    return model


