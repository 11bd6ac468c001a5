"""BatchNorm's mode while the body trains: a policy of the fine-tuning stage (`finetune.bn`), stated as
freezing is.

- `train` (the guide's and torchvision's): BatchNorm layers normalise each batch by its own statistics
  and update their running statistics, the ones evaluation and inference use.
- `frozen`: the body's BatchNorm layers use and keep their running statistics (eval mode) also while
  the body trains; their scale and shift still train. Detection models freeze BatchNorm so
  (torchvision's `FrozenBatchNorm2d`) because batches of a few images give poor statistics, and the
  pretrained ones describe the data the body was trained on.

`auto` is `frozen` for a body from trained weights and `train` for a random one (`resolve_auto`): the
head-only epochs train the head on the body's features in eval mode (cached once, engine/features.py),
and under `train` the head meets other features at the unfreeze (real Inception v3 weights, issue 41, 16
tiny-imagenet photos: cosine 0.455 between the pooled features in training and in eval mode). `train`
stays the default because it measured better where the body trained: head 2 epochs then the whole model
at lr 0.01 on 10 tiny-imagenet classes, 1 seed each, train 0.910 against frozen 0.755; EfficientNet-Lite0
at one rate 0.01, frozen, fell to chance in its first epoch. The collapses of issue 41 came with rates of
0.1-0.26, where frozen diverged too (a NaN); the exploding-loss rule (engine/fit.py) now stops them.

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
