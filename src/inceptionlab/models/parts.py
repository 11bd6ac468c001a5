"""Which parameters of a classifier are its head, its auxiliary heads and its body, and the body's layers.

Fine-tuning needs these for every model the registry builds, found the same way for all of them
rather than by name patterns per recipe:

- the **head**: the layer that outputs the classes (a Linear, or SqueezeNet's 1x1 Conv, with one
  output per class; one logit for a binary task). Where several layers have that width (VGG at 4096
  classes), the last registered one outside the auxiliary heads: the one that feeds the output;
- the **auxiliary heads**: whole modules that only serve an auxiliary loss (Inception v3's
  `AuxLogits`, GoogLeNet's `aux1`/`aux2`);
- the **body**: everything else, split into **layers** in registration order (input side first) for
  layer-wise learning rates: the children of the model, with plain containers (Sequential, ModuleList,
  ModuleDict: ResNet's `layer3`, EfficientNet's `features`) opened into their children, and any module
  holding at least half of the body's parameters opened too (ViT's `encoder` would otherwise be one
  layer of 12 blocks). ResNet50: stem conv, stem BN, 16 bottleneck blocks; Inception v3: 16 named
  blocks (Conv2d_1a_3x3 ... Mixed_7c); ViT-B/16: patch projection, class token and position embedding,
  12 encoder blocks, final LayerNorm. A timm model's head is what its `get_classifier()` returns and its
  layers are its own `group_matcher()` groups (models/timm_source.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from torch import nn

from inceptionlab.models import timm_source

# Modules holding auxiliary classifiers (Inception v3, GoogLeNet): trained for their loss only, dropped
# when the aux loss is off (as the guide does), and never part of the head a linear probe trains.
AUX_HEAD_ATTRS = ("AuxLogits", "aux1", "aux2")
# Exact types only: torchvision's MLPBlock subclasses Sequential but is one layer of a ViT block.
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


@dataclass(frozen=True)
class Layer:
    name: str  # module name ("" for parameters set on the model itself)
    params: tuple[str, ...]  # parameter names (model.named_parameters()) in this layer


@dataclass(frozen=True)
class ModelParts:
    head_modules: tuple[str, ...]  # the output layer(s) of the main classifier
    aux_modules: tuple[str, ...]  # auxiliary classifier modules
    head: tuple[str, ...]  # parameter names of the head
    aux: tuple[str, ...]  # parameter names of the auxiliary heads
    layers: tuple[Layer, ...]  # the body, input side first

    @property
    def body(self) -> tuple[str, ...]:
        return tuple(name for layer in self.layers for name in layer.params)

    def describe(self) -> str:
        aux = f", auxiliary heads {', '.join(self.aux_modules)} ({len(self.aux)} tensors)" if self.aux_modules else ""
        return (f"head {', '.join(self.head_modules)} ({len(self.head)} tensors){aux}, "
                f"body {len(self.layers)} layers ({len(self.body)} tensors)")


def output_layers(model: nn.Module, num_outputs: int) -> list[str]:
    """Names of the layers producing `num_outputs`: Linear, or 1x1 Conv (SqueezeNet), in registration order."""
    names = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module.out_features == num_outputs:
            names.append(name)
        elif isinstance(module, nn.Conv2d) and module.out_channels == num_outputs and module.kernel_size == (1, 1):
            names.append(name)
    return names


def aux_modules(model: nn.Module) -> list[str]:
    return [attr for attr in AUX_HEAD_ATTRS if isinstance(getattr(model, attr, None), nn.Module)]


def _inside(name: str, modules: list[str] | tuple[str, ...]) -> bool:
    return any(name == m or name.startswith(m + ".") for m in modules)


def head_modules(model: nn.Module, num_classes: int) -> list[str]:
    """The main classifier's output layer: see the module docstring (timm's models name theirs)."""
    named = timm_source.classifier_name(model)
    if named is not None:
        return [named]
    aux = aux_modules(model)
    widths = [num_classes] + ([1] if num_classes == 2 else [])  # binary tasks: one logit
    for width in widths:
        found = [n for n in output_layers(model, width) if not _inside(n, aux)]
        if found:
            return [found[-1]]
    layers = [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d)) and not _inside(n, aux)]
    return layers[-1:]


def model_parts(model: nn.Module, num_classes: int) -> ModelParts:
    head = head_modules(model, num_classes)
    aux = aux_modules(model)
    names = [name for name, _ in model.named_parameters()]
    owner = lambda param: param.rsplit(".", 1)[0] if "." in param else ""  # noqa: E731
    head_params = tuple(n for n in names if _inside(owner(n), head))
    aux_params = tuple(n for n in names if _inside(owner(n), aux))
    skip = (*head, *aux)
    groups = timm_source.parameter_groups(model)
    if groups is not None:  # timm's own grouping (group_matcher), as its layer-wise decay uses
        layers = tuple(Layer(_common_module(g), tuple(n for n in g if not _inside(owner(n), skip)))
                       for g in groups if any(not _inside(owner(n), skip) for n in g))
        return ModelParts(tuple(head), tuple(aux), head_params, aux_params, layers)
    body_total = sum(p.numel() for n, p in model.named_parameters() if not _inside(owner(n), skip))
    layers = tuple(_layers(model, "", skip, body_total))
    return ModelParts(tuple(head), tuple(aux), head_params, aux_params, layers)


def _common_module(params: list[str]) -> str:
    """The module path all `params` share ("blocks.1.1"); for a group spanning several, their top modules in
    order ("conv_stem, bn1": timm's stem group)."""
    paths = [p.split(".")[:-1] for p in params]
    common = []
    for parts in zip(*paths):
        if len(set(parts)) > 1:
            break
        common.append(parts[0])
    if common:
        return ".".join(common)
    tops = [".".join(path[:3] if path and path[0] == "blocks" else path[:1]) for path in paths]
    return ", ".join(dict.fromkeys(tops))


def _params_outside(module: nn.Module, prefix: str, skip: tuple[str, ...], recurse: bool = True) -> list[tuple[str, int]]:
    found = []
    for name, param in module.named_parameters(recurse=recurse):
        full = f"{prefix}{name}"
        if not _inside(full.rsplit(".", 1)[0] if "." in full else "", skip):
            found.append((full, param.numel()))
    return found


def _layers(module: nn.Module, prefix: str, skip: tuple[str, ...], body_total: int) -> Iterator[Layer]:
    own = _params_outside(module, prefix, skip, recurse=False)
    if own:  # parameters set on this module itself (ViT's class token): a layer before its children
        yield Layer(prefix.rstrip("."), tuple(name for name, _ in own))
    for name, child in module.named_children():
        full = f"{prefix}{name}"
        if _inside(full, skip):
            continue
        params = _params_outside(child, full + ".", skip)
        if not params:
            continue
        holds_skipped = any(s.startswith(full + ".") for s in skip)
        large = sum(n for _, n in params) * 2 >= body_total
        if any(True for _ in child.children()) and (type(child) in _CONTAINERS or holds_skipped or large):
            yield from _layers(child, full + ".", skip, body_total)
        else:
            yield Layer(full, tuple(name for name, _ in params))
