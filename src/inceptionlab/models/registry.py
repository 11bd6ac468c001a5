"""Model registry: one API over torchvision's classification models and our own small ones.

`build_model` loads pretrained weights when asked (from the torch hub cache or a file; never a
silent download failure), replaces the classification head(s) with ones sized to the dataset, and
drops or keeps Inception's auxiliary head. `rebuild_model` recreates a trained model from its spec.
"""

from __future__ import annotations

import inspect
import logging
import sys
from importlib import resources
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn

from inceptionlab.checkpoint import RunDir
from inceptionlab.config import DataConfig, needed_cache_size
from inceptionlab.errors import UserError
from inceptionlab.fileio import sha256_file
from inceptionlab.models import timm_source
from inceptionlab.models.parts import AUX_HEAD_ATTRS, output_layers
from inceptionlab.models.small import SMALL_MODELS, SMALL_PREPROCESSING
from inceptionlab.models.spec import IMAGENET_MEAN, IMAGENET_STD, ModelSpec, Preprocessing
from inceptionlab.models.weights import (ExpectedInput, WeightsSource, decide_transform_input, fit_weights,
                                         read_state_dict, source_from_path)

if TYPE_CHECKING:
    import torchvision  # ~1.3 s: text and array runs never need it


def _tv_models() -> Any:
    """torchvision.models, imported on first use: it adds ~1.3 s to start-up, and the text and
    in-memory case studies never need it."""
    import torchvision.models  # ~1.3 s: text and array runs never need it

    return torchvision.models


log = logging.getLogger(__name__)
def inception_v3_fid(num_classes: int = 1000, aux_logits: bool = False, transform_input: bool = False,
                     init_weights: bool = True, dropout: float = 0.5) -> nn.Module:
    """Inception v3 with the pooling of Google's 2015 graph (models/inception_fid.py)."""
    from inceptionlab.models.inception_fid import inception_v3_fid as build  # torchvision: ~1.3 s, see _tv_models

    return build(num_classes, aux_logits, transform_input, init_weights, dropout)


# Our own models: the guide's small case-study networks, and the preprocessing they declare; Inception v3 as
# Google's 2015 graph computes it, with torchvision's Inception v3 preprocessing.
_OWN_MODELS: dict[str, Callable[..., nn.Module]] = {**SMALL_MODELS, "inception_v3_fid": inception_v3_fid}
_OWN_PREPROCESSING: dict[str, Preprocessing | None] = {
    **SMALL_PREPROCESSING, "inception_v3_fid": Preprocessing(342, 299, "bilinear", IMAGENET_MEAN, IMAGENET_STD)}

# Builder arguments torchvision's builders set by themselves when given pretrained weights: the
# Google-trained Inception/GoogLeNet weights expect inputs normalised to [-1, 1], which
# `transform_input=True` recreates from ImageNet-normalised tensors inside the model (its constants are
# ImageNet's: `build_model` sets it so the first layer sees [-1, 1], weights.decide_transform_input).
_PRETRAINED_ARCH_KWARGS: dict[str, dict[str, Any]] = {
    "inception_v3": {"transform_input": True, "aux_logits": True, "init_weights": False},
    "googlenet": {"transform_input": True, "aux_logits": True, "init_weights": False},
    "inception_v3_fid": {"transform_input": True, "aux_logits": True, "init_weights": False},
}


def register_model(name: str, preprocessing: Preprocessing | None) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Add your own builder (with the preprocessing recipes fall back to; None: it takes no images)."""

    def add(builder: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        _OWN_MODELS[name] = builder
        _OWN_PREPROCESSING[name] = preprocessing
        return builder

    return add


def available_models() -> list[str]:
    models = _tv_models()
    return sorted(set(models.list_models(module=models)) | set(_OWN_MODELS))


def _check_known(name: str) -> None:
    if name in _OWN_MODELS:  # decided without importing torchvision (~1.3 s, see _tv_models)
        return
    if timm_source.is_timm(name):
        timm_source.check_known(name)
        return
    if name not in available_models():
        raise UserError(
            f"unknown model {name!r}: use a torchvision classification model name "
            f"(e.g. inception_v3, resnet50), timm/<a timm model> or one of ours "
            f"({', '.join(sorted(_OWN_MODELS)) or 'none'})"
        )


def model_arguments(name: str) -> list[str] | None:
    """The builder arguments `name` takes (None when they cannot be listed): its builder's own and its
    class's constructor's, which torchvision builders pass their **kwargs on to."""
    _check_known(name)
    if name in _OWN_MODELS:
        return _named_parameters(_OWN_MODELS[name])
    if timm_source.is_timm(name):
        return None  # timm passes them to each model class's own constructor: timm.create_model checks them
    models = _tv_models()
    arguments = set(_named_parameters(models.get_model_builder(name)) or []) - {"weights", "progress"}
    try:
        # The class is found by building on the meta device: no memory, no init (~0.1 s for Inception v3).
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls = type(models.get_model(name, weights=None))
    except Exception:  # a builder that copies tensors on build (RegNet): its arguments stay unlisted
        return None
    return sorted((arguments | set(_named_parameters(cls.__init__) or [])) - {"self", "num_classes"})


def _named_parameters(function: Callable[..., Any]) -> list[str] | None:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return None
    return [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "num_classes"]


def check_model_kwargs(name: str, kwargs: dict[str, Any]) -> None:
    """A one-line error naming the first argument `name` does not take, and the ones it does."""
    if not kwargs:
        return
    if "num_classes" in kwargs:
        raise UserError("model.kwargs.num_classes: set model.num_classes instead (null follows the dataset)")
    accepted = model_arguments(name)
    if accepted is None:
        return
    unknown = [key for key in kwargs if key not in accepted]
    if unknown:
        raise UserError(_kwargs_message(name, unknown[0], accepted))


def _kwargs_message(name: str, key: str, accepted: list[str] | None) -> str:
    listed = ", ".join(accepted) if accepted else "none listed"
    return (f"model.kwargs.{key}: {name} takes no argument {key!r} (its arguments: {listed}); "
            f"drop it with --set model.kwargs.{key}=null, or all of them with --set 'model.kwargs={{}}'")


def _construct(builder: Callable[..., nn.Module], name: str, **kwargs: Any) -> nn.Module:
    """Call a builder; an argument it refuses is the user's one-line error, not a traceback."""
    try:
        return builder(**kwargs)
    except TypeError as exc:
        message = str(exc)
        if "argument" not in message:
            raise
        key = message.rsplit("'", 2)[-2] if message.count("'") >= 2 else "?"
        raise UserError(_kwargs_message(name, key, model_arguments(name))) from None


def imagenet_wnids() -> list[str]:
    """The 1000 ImageNet-1k WordNet ids in class-index order (shipped with the package): the names of the
    rows of every ImageNet head here (torchvision's, timm's, the converted weights')."""
    return resources.files("inceptionlab").joinpath("resources/imagenet_synsets.txt").read_text().split()


def imagenet_labels() -> list[str]:
    """ImageNet-1k's human labels in class-index order, as torchvision's weights name them ("Samoyed")."""
    return list(_tv_models().ResNet18_Weights.IMAGENET1K_V1.meta["categories"])


def _timm_classes(name: str) -> tuple[list[str], list[str]] | None:
    """A timm model's pretrained rows: (wnids, labels), ImageNet-1k's labelled as torchvision's are."""
    named = timm_source.class_names(name)
    if named is not None and named[0] == imagenet_wnids():
        return named[0], imagenet_labels()
    return named


def default_weights(name: str) -> "torchvision.models.WeightsEnum":
    return _tv_models().get_model_weights(name).DEFAULT


def cached_weights_file(name: str) -> Path:
    """Where torch.hub keeps (or would keep) the model's default ImageNet weights."""
    url = default_weights(name).url
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(url).name


def _hash_prefix(url: str) -> str:
    # torchvision file names end in -<first 8+ hex digits of the file's sha256>.pth
    return Path(url).stem.rsplit("-", 1)[-1]


def _load_imagenet_state_dict(name: str) -> dict[str, torch.Tensor]:
    """The model's ImageNet weights from the torch hub cache, downloaded into it first when absent (and
    said, in our words, before the network is tried: torch.hub's loader prints its own `Downloading:` line
    on stdout, inside `--json` output too)."""
    weights = default_weights(name)
    target = cached_weights_file(name)
    if not target.is_file():
        _download_imagenet_weights(name, weights.url, target)
    return read_state_dict(target)[0]


def _download_imagenet_weights(name: str, url: str, target: Path) -> None:
    print(f"weights: downloading {name}'s ImageNet weights from {url} into {target.parent}/ (once: later runs "
          "read them from there)", file=sys.stderr, flush=True)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # torch's own: a temporary file beside the target, the sha256 prefix in the name checked, then renamed
        torch.hub.download_url_to_file(url, str(target), _hash_prefix(url), progress=sys.stderr.isatty())
    except Exception as exc:  # any network or file error: the fix is the same
        raise UserError(
            f"{name} ImageNet weights not found and not downloadable ({type(exc).__name__}): "
            f"put {target.name} (sha256 starts {_hash_prefix(url)}) from {url} "
            f"into {target.parent}/, or use a local file: --weights PATH (predict, evaluate, export, bench, serve) "
            "or --set model.weights=PATH (train)"
        ) from None


def load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A state_dict from a weights file or a training checkpoint (the weights the run keeps); the one loader."""
    return read_state_dict(Path(path))[0]


def _new_like(layer: nn.Module, num_classes: int) -> nn.Module:
    if isinstance(layer, nn.Linear):
        return nn.Linear(layer.in_features, num_classes, bias=layer.bias is not None)
    return nn.Conv2d(layer.in_channels, num_classes, kernel_size=1)


def replace_heads(model: nn.Module, old_classes: int, num_classes: int) -> list[str]:
    """Swap every classification output layer (main and auxiliary) for a fresh one."""
    names = output_layers(model, old_classes)
    if not names:
        raise UserError(f"{type(model).__name__}: found no output layer with {old_classes} outputs to replace")
    for name in names:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, _new_like(getattr(parent, attr), num_classes))
    return names


def drop_aux_heads(model: nn.Module) -> None:
    """The guide's `model.aux_logits = False; model.AuxLogits = None`, for any model that has them."""
    if hasattr(model, "aux_logits"):
        model.aux_logits = False
    for attr in AUX_HEAD_ATTRS:
        if getattr(model, attr, None) is not None:
            setattr(model, attr, None)


def _arch_kwargs(model: nn.Module) -> dict[str, Any]:
    """Builder arguments that `rebuild_model` needs to recreate this exact module tree."""
    kwargs: dict[str, Any] = {}
    for attr in ("aux_logits", "transform_input"):
        if hasattr(model, attr):
            kwargs[attr] = bool(getattr(model, attr))
    if "aux_logits" in kwargs:
        kwargs["init_weights"] = False  # weights are loaded right after: skip the slow init
    return kwargs


@dataclass
class BuiltModel:
    model: nn.Module
    arch_kwargs: dict[str, Any]
    pretrained: str | None  # what was loaded: "imagenet", a path, or None (random init)
    source_classes: list[str] | None  # the pretrained weights' own class names
    report: list[str] = field(default_factory=list)  # what was loaded, kept, replaced, started new
    record: dict[str, Any] | None = None  # the same, with the file's checksum: the run's weights.json


def _want_pretrained(name: str, weights: str | None) -> str | None:
    """Resolve `imagenet_if_cached` to imagenet or None; pass everything else through."""
    if weights == "imagenet_if_cached":
        cached = timm_source.is_cached(name) if timm_source.is_timm(name) else cached_weights_file(name).is_file()
        return "imagenet" if cached else None
    return weights


RANDOM_WEIGHTS = "random"  # --weights random: no file, no download (latency and the protocol do not depend on values)
RANDOM_WEIGHTS_SEED = 0  # the same "random" model every time, whatever the caller's RNG state


def starting_weights(name: str, weights: str | None) -> WeightsSource | None:
    """The weights a model named `name` starts from (None: random init), with what is known of them: the
    architecture, classes and input their run, checkpoint or sidecar records (models/weights.py). Read once
    per run: the session fills the recipe's empty preprocessing from them, then `build_model` fits them.
    ImageNet's (torchvision's, timm's) are read, or downloaded, only then (WeightsSource.load)."""
    weights = _want_pretrained(name, weights)
    if weights is None or weights == RANDOM_WEIGHTS:
        return None
    if weights == "imagenet" and timm_source.is_timm(name):
        return _timm_imagenet_source(name)
    if weights == "imagenet":
        if name in _OWN_MODELS:
            raise UserError(f"model {name!r} has no ImageNet weights: set model.weights=null, a weights file "
                            "or a run directory" + (
                                " (Google's 2015 weights, converted: python tools/real_weights.py fetch, then "
                                "model.weights=$(python tools/real_weights.py path inception_v3_fid))"
                                if name == "inception_v3_fid" else ""))
        categories = list(default_weights(name).meta["categories"])
        preprocessing = weights_preprocessing(name)
        # Rows named by WordNet id, so a dataset of ImageNet classes (tiny-imagenet's wnids) keeps them.
        source = WeightsSource({}, f"{name} ImageNet weights", name, imagenet_wnids(),
                               dict(_PRETRAINED_ARCH_KWARGS.get(name, {})), match_names=False,
                               file=cached_weights_file(name), class_labels=categories,
                               pending=lambda: _load_imagenet_state_dict(name))
        source.expects = ExpectedInput(preprocessing.mean, preprocessing.std,
                                       True if name in _PRETRAINED_ARCH_KWARGS else None,
                                       f"torchvision's {name} ImageNet weights")
        return source
    source = source_from_path(Path(weights).expanduser())
    if source.arch is not None and source.arch != name:
        raise UserError(f"{weights}: weights of a {source.arch} model, not {name}: set model.name={source.arch}")
    if source.expects is None:
        source.expects = _assumed_input(name, source)
    if source.arch is None:  # a plain state_dict: torchvision's layout for that architecture
        source.arch_kwargs = {**_PRETRAINED_ARCH_KWARGS.get(name, {}), **source.arch_kwargs}
    return source


def _timm_imagenet_source(name: str) -> WeightsSource:
    """A timm model's pretrained weights (timm_source.pretrained_state) with what its config says of them."""
    named = _timm_classes(name)
    preprocess = timm_source.preprocessing(name)
    source = WeightsSource({}, f"{name} pretrained weights", name, named[0] if named else None,
                           match_names=False, file=timm_source.cached_file(name),
                           class_labels=named[1] if named else None, pending=lambda: timm_source.pretrained_state(name))
    source.expects = ExpectedInput(preprocess.mean, preprocess.std, None, f"timm's pretrained config of {name}")
    return source


def _assumed_input(name: str, source: WeightsSource) -> ExpectedInput | None:
    """With nothing recorded beside the weights: the architecture's defaults, said as an assumption. A plain
    Inception v3 / GoogLeNet file is taken as torchvision's (Google's weights: pixels in [-1, 1])."""
    defaults = model_preprocessing(name)
    if defaults is None:  # the model takes no images
        return None
    sidecar = source.file.with_suffix(".json") if source.file is not None else None
    google = name in _PRETRAINED_ARCH_KWARGS and "transform_input" not in source.arch_kwargs
    where = (f"{name}'s defaults (nothing recorded with the weights)" if not google else
             f"taken as torchvision's own {name} file: Google's weights, pixels in [-1, 1] (nothing recorded with "
             f"the weights; {sidecar} with mean, std and transform_input says otherwise)")
    return ExpectedInput(tuple(defaults.mean), tuple(defaults.std),
                         True if google else source.arch_kwargs.get("transform_input"), where, recorded=False)


def _builder(name: str, num_classes: int) -> Callable[..., nn.Module]:
    if name in _OWN_MODELS:
        return lambda **kwargs: _OWN_MODELS[name](num_classes=num_classes, **kwargs)
    if timm_source.is_timm(name):
        return lambda **kwargs: timm_source.create(name, num_classes, **kwargs)
    return lambda **kwargs: _tv_models().get_model(name, weights=None, num_classes=num_classes, **kwargs)


def build_model(
    name: str,
    num_classes: int,
    weights: str | WeightsSource | None = None,
    aux_loss_weight: float | None = None,
    class_names: list[str] | None = None,
    *,
    normalisation: tuple[Any, Any] | None = None,
    **kwargs: Any,
) -> BuiltModel:
    """A model ready to train or run: starting weights fitted (models/weights.py), heads sized to
    `num_classes`, Inception's aux head kept only when weighted. `weights`: what `starting_weights` takes,
    or what it gave. `class_names` (the dataset's) lets a head carry over the classes both have.
    `normalisation`: the (mean, std) the inputs are normalised with (None: as the weights expect), from
    which Inception/GoogLeNet's `transform_input` is chosen so that the first layer sees what the weights
    were trained on (weights.decide_transform_input). `weights` "random": random init from
    RANDOM_WEIGHTS_SEED, the caller's RNG left as it was (the same model every time)."""
    _check_known(name)
    if weights == RANDOM_WEIGHTS:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(RANDOM_WEIGHTS_SEED)
            return build_model(name, num_classes, None, aux_loss_weight, class_names, normalisation=normalisation,
                               **kwargs)
    check_model_kwargs(name, kwargs)
    source = weights if isinstance(weights, WeightsSource) else starting_weights(name, weights)
    wants_aux = aux_loss_weight is not None
    build = _builder(name, num_classes)
    if source is None:
        if name in _PRETRAINED_ARCH_KWARGS:
            kwargs.setdefault("aux_logits", wants_aux)
            kwargs.setdefault("init_weights", True)  # torchvision's init; None only adds a warning
        model = _construct(build, name, **kwargs)
        return BuiltModel(model, {**kwargs, **_arch_kwargs(model)}, None, None)

    arch_kwargs = {**source.arch_kwargs, **kwargs}
    has_switch = "transform_input" in arch_kwargs or name in _PRETRAINED_ARCH_KWARGS
    decision = None
    if source.expects is not None:
        decision = decide_transform_input(source.expects, normalisation or (source.expects.mean, source.expects.std),
                                          has_switch and "transform_input" not in kwargs)
        if decision.transform_input is not None:
            arch_kwargs["transform_input"] = decision.transform_input
    if "aux_logits" in arch_kwargs or name in _PRETRAINED_ARCH_KWARGS:
        arch_kwargs["aux_logits"] = wants_aux
        arch_kwargs["init_weights"] = False  # the weights are loaded right after: skip the slow init
    model = _construct(build, name, **arch_kwargs)
    fitted = fit_weights(model, source, num_classes, class_names, name)
    if not wants_aux:
        drop_aux_heads(model)
    keep = _arch_kwargs(model) | dict(kwargs) if name not in _OWN_MODELS else arch_kwargs
    lines = [*fitted.lines, *(decision.lines if decision is not None else [])]
    record = _weights_record(source, fitted.record, keep.get("transform_input"), lines)
    pretrained = "imagenet" if source.where in (f"{name} ImageNet weights", f"{name} pretrained weights") else str(
        source.file)
    return BuiltModel(model, keep, pretrained, source.class_labels or source.class_names, lines, record)


def _weights_record(source: WeightsSource, fitted: dict[str, Any], transform_input: bool | None,
                    lines: list[str]) -> dict[str, Any]:
    """What the run's weights.json keeps: where the weights came from and every decision made on them."""
    file = source.file
    return {
        "file": str(file) if file is not None else None,
        "sha256": sha256_file(file) if file is not None and file.is_file() else None,
        "arch": source.arch,
        "described_by": str(source.described_by) if source.described_by is not None else None,
        "about": source.about,
        "unwrapped": list(source.unwrapped),
        "prefixes_removed": list(source.prefixes_removed) + ([source.sub_module[0]] if source.sub_module else []),
        **fitted,
        "expects": source.expects.to_dict() if source.expects is not None else None,
        "transform_input": transform_input,
        "lines": list(lines),
    }


def rebuild_model(spec: ModelSpec) -> nn.Module:
    """An untrained module with exactly the tree described by `spec`, for loading a state_dict."""
    _check_known(spec.arch)
    if spec.arch in _OWN_MODELS:
        return _OWN_MODELS[spec.arch](num_classes=spec.num_classes, **spec.arch_kwargs)
    if timm_source.is_timm(spec.arch):
        return timm_source.create(spec.arch, spec.num_classes, **spec.arch_kwargs)
    return _tv_models().get_model(spec.arch, weights=None, num_classes=spec.num_classes, **spec.arch_kwargs)


def weights_preprocessing(name: str) -> Preprocessing:
    """The eval preprocessing torchvision's default weights of `name` were scored with, read from the
    weights enum's `transforms()` metadata (no file is downloaded): resnet50 232 -> 224, inception_v3
    342 -> 299, efficientnet_b0 256 -> 224 bicubic."""
    preset = default_weights(name).transforms()
    return Preprocessing(
        resize_size=int(preset.resize_size[0]),
        crop_size=int(preset.crop_size[0]),
        interpolation=preset.interpolation.value,
        mean=tuple(preset.mean),
        std=tuple(preset.std),
    )


def model_preprocessing(name: str) -> Preprocessing | None:
    """Default preprocessing of a registry model: its weights' metadata, or what our model declares."""
    _check_known(name)
    if name in _OWN_MODELS:
        return _OWN_PREPROCESSING[name]
    if timm_source.is_timm(name):
        return timm_source.preprocessing(name)
    return weights_preprocessing(name)


def _first_set(*values: Any) -> Any:
    return next(value for value in values if value is not None)


def resolve_data_config(data: DataConfig, model_name: str, weights: WeightsSource | None = None) -> DataConfig:
    """`data` with every empty (null) preprocessing field taken from the weights' record (a run's spec, a
    sidecar: `weights`), else the model's defaults (timm's resolve_data_config): a recipe states only what it
    changes, so `--set model.name=resnet50` gets ResNet's 232 -> 224 instead of Inception's 342 -> 299, and
    a run continued from another gets the normalisation it was trained with. The training crop follows the
    eval crop."""
    defaults = model_preprocessing(model_name)
    if defaults is None:  # no image input (text): nothing to fill
        return data
    recorded = weights.preprocessing if weights is not None else {}
    default = lambda key: recorded.get(key, getattr(defaults, key))  # noqa: E731
    crop = _first_set(data.val_crop_size, default("crop_size"))
    try:
        filled = replace(
            data,
            val_resize_size=_first_set(data.val_resize_size, default("resize_size")),
            val_crop_size=crop,
            train_crop_size=_first_set(data.train_crop_size, crop),
            interpolation=_first_set(data.interpolation, default("interpolation")),
            mean=list(_first_set(data.mean, default("mean"))),
            std=list(_first_set(data.std, default("std"))),
        )
        # The decoded cache keeps what the eval resize and a whole-image training crop need.
        return replace(filled, cache_size=_first_set(filled.cache_size, needed_cache_size(filled)))
    except ValueError as exc:
        raise UserError(f"{exc} (after filling the empty data fields from {model_name}'s defaults)") from None


def pretrained_spec(name: str) -> ModelSpec:
    """The spec of torchvision's default ImageNet weights, preprocessing from their own metadata."""
    _check_known(name)  # else torchvision's own ValueError: an internal failure instead of a one-line error
    if name in _OWN_MODELS:
        raise UserError(f"--model {name}: has no pretrained weights to serve or run; train it first and give the "
                        "run directory instead")
    if timm_source.is_timm(name):
        return _timm_pretrained_spec(name)
    weights = default_weights(name)
    preprocess = weights_preprocessing(name)
    categories = list(weights.meta["categories"])
    return ModelSpec(
        arch=name,
        num_classes=len(categories),
        class_names=categories,
        crop_size=preprocess.crop_size,
        resize_size=preprocess.resize_size,
        interpolation=preprocess.interpolation,
        mean=list(preprocess.mean),
        std=list(preprocess.std),
        arch_kwargs=dict(_PRETRAINED_ARCH_KWARGS.get(name, {}), aux_logits=False)
        if name in _PRETRAINED_ARCH_KWARGS
        else {},
    )


def _timm_pretrained_spec(name: str) -> ModelSpec:
    """The spec of a timm model's pretrained weights: its config's preprocessing, ImageNet's classes by wnid."""
    named = _timm_classes(name)
    if named is None:
        raise UserError(f"--model {name}: its pretrained head's classes are not ImageNet's: train it first and give "
                        "the run directory instead")
    preprocess = timm_source.preprocessing(name)
    return ModelSpec(arch=name, num_classes=len(named[0]), class_names=named[0], class_labels=named[1],
                     crop_size=preprocess.crop_size, resize_size=preprocess.resize_size,
                     interpolation=preprocess.interpolation, mean=list(preprocess.mean), std=list(preprocess.std))


def load_run_model(run_dir: Path, weights: Path | None = None) -> tuple[nn.Module, ModelSpec]:
    """The trained model of a run directory (model.pt, else best.pt), in eval mode, on the CPU."""
    run = RunDir.open(run_dir)
    spec = ModelSpec.load(run.spec_file)
    model = rebuild_model(spec)
    path = weights or run.weights_for_inference()
    try:
        model.load_state_dict(load_state_dict(Path(path)))
    except RuntimeError as exc:
        raise UserError(f"{path}: weights do not match {run.spec_file} ({str(exc).splitlines()[0]})") from None
    return model.eval(), spec


def load_pretrained_model(name: str, weights: str = "imagenet") -> tuple[nn.Module, ModelSpec]:
    """A pretrained classifier with its own spec (ImageNet classes, the weights' preprocessing), in eval mode;
    weights "random": the same architecture from RANDOM_WEIGHTS_SEED, to try a command offline."""
    spec = pretrained_spec(name)
    built = build_model(name, spec.num_classes, weights)
    if weights == RANDOM_WEIGHTS:
        spec.arch_kwargs = dict(built.arch_kwargs)  # as built: no pretrained-only arguments (transform_input)
    return built.model.eval(), spec


# --- Grad-CAM's target layer: where the model's last spatial feature map is. -------------------------------
# Named for the guide's models and torchvision's common families (by name prefix, first match wins): the
# last block before global pooling (Inception v3: Mixed_7c, 8x8 at 299 px; ResNet: layer4, 7x7 at 224 px;
# the guide's CIFAR-10 network: the ReLU after its second convolution, 10x10 at 32 px, finer than the
# 5x5 of the pooling after it). Any other model gets the last module whose output is a spatial NCHW map
# (found by one forward pass at the model's input size).
CAM_LAYERS: dict[str, str] = {
    "inception_v3": "Mixed_7c", "googlenet": "inception5b", "cifar10_cnn": "4",
    "resnet": "layer4", "resnext": "layer4", "wide_resnet": "layer4",
    "densenet": "features", "vgg": "features", "alexnet": "features", "squeezenet": "features",
    "mobilenet": "features", "efficientnet": "features", "convnext": "features", "mnasnet": "layers",
    "regnet": "trunk_output", "shufflenet": "conv5",
}
# Models with no spatial feature map to explain, and why (a plain message for `--explain`).
NO_CAM_LAYER: dict[str, str] = {
    "fashion_mlp": "a multilayer perceptron on flattened pixels has no spatial feature map",
    "text_classifier": "it classifies text, not images",
    "vit_": "a vision transformer's tokens form no convolutional feature map after its patch embedding",
}


def _by_prefix(table: dict[str, str], arch: str) -> str | None:
    return next((value for prefix, value in table.items() if arch.startswith(prefix)), None)


def find_spatial_layer(model: nn.Module, input_shape: tuple[int, ...]) -> str | None:
    """The last module (in the order modules finish) whose output is an (N, C, H, W) map with H, W > 1."""
    finished: list[str] = []

    def record(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            if isinstance(output, torch.Tensor) and output.ndim == 4 and min(output.shape[2:]) > 1:
                finished.append(name)
        return hook

    handles = [m.register_forward_hook(record(n)) for n, m in model.named_modules() if n]
    try:
        with torch.inference_mode():
            model.eval()(torch.zeros(1, *input_shape))
    finally:
        for handle in handles:
            handle.remove()
    return finished[-1] if finished else None


def cam_layer(arch: str, model: nn.Module, input_shape: tuple[int, ...]) -> str:
    """The name of the module Grad-CAM explains `model` at (see CAM_LAYERS)."""
    reason = _by_prefix(NO_CAM_LAYER, arch)
    if reason is not None:
        raise UserError(f"{arch}: no Grad-CAM: {reason}")
    named = _by_prefix(CAM_LAYERS, arch)
    if named is not None and named in dict(model.named_modules()):
        return named
    found = find_spatial_layer(model, input_shape)
    if found is None:
        raise UserError(f"{arch}: no Grad-CAM: no layer gives a spatial feature map at input {tuple(input_shape)}")
    return found
