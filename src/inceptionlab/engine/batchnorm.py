"""BatchNorm's mode while the body trains: a policy of the fine-tuning stage (`finetune.bn`), stated as
freezing is.

- `train` (the guide's and torchvision's): BatchNorm layers normalise each batch by its own statistics
  and update their running statistics, the ones evaluation and inference use.
- `frozen`: the body's BatchNorm layers use and keep their running statistics (eval mode) also while
  the body trains; their scale and shift still train. Detection models freeze BatchNorm so
  (torchvision's `FrozenBatchNorm2d`) because batches of a few images give poor statistics, and the
  pretrained ones describe the data the body was trained on.

`auto` (the default) is `frozen` for a body from trained weights and `train` for a random one
(`resolve_auto`). Why frozen: the head-only epochs train the head on the body's features in eval mode
(cached once, engine/features.py); under `train` the head met other features at the unfreeze. Real
Inception v3 weights (issue 41) on 16 tiny-imagenet photos: pooled features in training mode had cosine
0.455 to the eval-mode ones (batch variance 0.12-0.55 of the running variance in some layers), and every
head-first-then-whole run collapsed at the unfreeze (validation 0.82 -> chance, loss 2.5e16). Kept
frozen, the head meets the features it learnt on, and the statistics of ImageNet's 1.28M images stay
those inference uses instead of a few batches' of 4-32 images.

While the body is frozen (head-only epochs, `finetune.body_lr_mult=0`) its BatchNorm layers always use
and keep their running statistics, whatever the policy: a frozen body whose statistics moved would not
be frozen, and cached features would not be the body's (engine/finetune.py). The head's own layers and
Inception's auxiliary heads follow `train` in every case: they are new, with no statistics to keep.
"""

from __future__ import annotations

from typing import Callable

from torch import nn

# The public BatchNorm classes (torch's private base _BatchNorm is not an API of every version; a lazy
# BatchNorm becomes one of these once materialised).
BATCHNORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def _keep_training(model: nn.Module, trained_apart: tuple[str, ...]) -> None:
    return None


def _use_running_statistics(model: nn.Module, trained_apart: tuple[str, ...]) -> None:
    for name, module in model.named_modules():
        if isinstance(module, BATCHNORM) and not _inside(name, trained_apart):
            module.eval()


def _inside(name: str, modules: tuple[str, ...]) -> bool:
    return any(name == module or name.startswith(module + ".") for module in modules)


# finetune.bn -> (what it does to a model in training mode, except inside `trained_apart`; how it is said)
BN_POLICIES: dict[str, tuple[Callable[[nn.Module, tuple[str, ...]], None], str]] = {
    "train": (_keep_training, "batch statistics, running statistics updated"),
    "frozen": (_use_running_statistics, "running statistics used and kept (eval mode), scale and shift trained"),
}


def resolve_auto(policy: str, pretrained: bool) -> str:
    """finetune.bn=auto: the running statistics of trained weights are kept (frozen); a random body's are
    0 and 1, so it trains with batch statistics (train), as the guide's from-scratch recipe does."""
    if policy != "auto":
        return policy
    return "frozen" if pretrained else "train"


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(module, BATCHNORM) for module in model.modules())


def apply_policy(policy: str, model: nn.Module, trained_apart: tuple[str, ...]) -> None:
    """After `model.train()`: the body's BatchNorm layers as `policy` says (not those in `trained_apart`)."""
    BN_POLICIES[policy][0](model, trained_apart)


def describe(policy: str) -> str:
    return f"BatchNorm: {BN_POLICIES[policy][1]}, finetune.bn={policy}"
