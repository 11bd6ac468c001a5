"""Starting weights for a model, loaded by a shape contract: the body must fit, the head is optional.

What `model.weights` may name, and what describes it:

- a run directory: its `spec.json` (architecture, classes, the input the model took), its inference weights;
- a file inside a run (`RUN/model.pt`, `RUN/checkpoints/best.pt`): that run's `spec.json`;
- a training checkpoint of ours elsewhere: the spec saved inside it;
- any other PyTorch file holding a state_dict: plain, or inside one of the common wrappers
  (`{"state_dict": ...}`, `{"model": ...}`, ...: WRAPPER_KEYS), with DistributedDataParallel's `module.` or
  torch.compile's `_orig_mod.` key prefixes (removed), or under one sub-module's prefix (`backbone.`,
  `encoder_q.`: taken when the rest of the file does not fit). A sidecar `NAME.json` beside `NAME.pt` may
  describe it (SIDECAR_KEYS: its architecture, classes, and the input it expects).

The contract: every tensor of the body is in the weights with its shape (BatchNorm's step counters may be
absent); the head follows the classes:

- no head in the weights (self-supervised checkpoints, timm's `num_classes=0`, a converted backbone), or
  one of another form: a new head;
- the same classes in the same order: the head is kept as is;
- other classes, the source's class names known (a run, a checkpoint, a sidecar): the head is replaced,
  and the rows of the classes both have are carried over by name;
- the names unknown (a plain file): kept when the number of classes is the same, replaced otherwise.

Auxiliary heads the model has and the weights lack start new; ones the weights have and the model drops
(model.aux_loss_weight null) are left out.

The input the weights expect (`ExpectedInput`: mean, std and Inception's `transform_input` as trained)
comes from what is recorded with them; with nothing recorded, the architecture's own defaults are assumed
and the run says so. `decide_transform_input` then makes the first layer see what it saw in training
whatever the new recipe normalises with, or warns when nothing can. Every decision is a line of
`Fitted.lines` and a field of `Fitted.record` (the run's `weights.json`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

from inceptionlab.checkpoint import RunDir
from inceptionlab.errors import UserError
from inceptionlab.models.parts import AUX_HEAD_ATTRS, head_modules
from inceptionlab.models.spec import IMAGENET_MEAN, IMAGENET_STD, ModelSpec

# Keys under which checkpoints of other tools keep the model's weights, looked for in this order:
# timm's and Lightning's `state_dict`, DeiT's and MAE's `model`, PyTorch's tutorial `model_state_dict`, and
# names seen in released classification and self-supervised checkpoints. A key holding a dict of tensors
# wins; the rest of the file (optimizer, epoch, arguments) is left out.
WRAPPER_KEYS = ("state_dict", "model", "model_state_dict", "model_state", "net", "network", "module", "weights",
                "params", "teacher")
# Of several sub-modules that each hold the whole body, the one evaluation uses: MoCo v1/v2's query encoder
# (v3: the base encoder, not the momentum one), a teacher-student pair's teacher, a backbone.
SUB_MODULES = ("encoder_q", "base_encoder", "teacher", "backbone", "encoder")
# Key prefixes that wrappers add to every name: removed wherever a file has them, and said.
WRAPPER_PREFIXES = {"module.": "saved from a DistributedDataParallel or DataParallel wrapper",
                    "_orig_mod.": "saved from a torch.compile'd model"}
# What a sidecar NAME.json beside a weights file may say (every key optional; anything else is refused):
SIDECAR_KEYS = {
    "arch": "the registry model the weights are for (model.name)",
    "class_names": "the head's classes in row order (ImageNet's wnids, your folder names)",
    "class_labels": "human names of those classes, in the same order",
    "mean": "per-channel mean the weights' inputs were normalised with",
    "std": "per-channel std the weights' inputs were normalised with",
    "transform_input": "Inception v3 / GoogLeNet: the model converted ImageNet-normalised inputs to [-1, 1] itself",
    "resize_size": "eval resize of the shorter side, px",
    "crop_size": "eval centre crop, px",
    "interpolation": "resize interpolation (bilinear, bicubic, ...)",
    "source": "where the weights came from (free text, kept in the run's weights.json)",
}
PREPROCESSING_KEYS = ("mean", "std", "resize_size", "crop_size", "interpolation")
HALF = (0.5, 0.5, 0.5)  # Google's Inception weights take pixels in [-1, 1]: (x - 0.5) / 0.5


@dataclass(frozen=True)
class ExpectedInput:
    """The input the weights were trained on: normalised by mean/std, then (Inception v3, GoogLeNet)
    `transform_input` as it was set. `where`: what says so; `recorded` False: an assumption."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    transform_input: bool | None  # None: the architecture has no such switch
    where: str
    recorded: bool = True

    def first_layer(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """The normalisation the first convolution saw (after transform_input)."""
        return first_layer_input(self.mean, self.std, bool(self.transform_input))

    def to_dict(self) -> dict[str, Any]:
        return {"mean": list(self.mean), "std": list(self.std), "transform_input": self.transform_input,
                "from": self.where, "recorded": self.recorded}


def first_layer_input(mean: Sequence[float], std: Sequence[float], transform_input: bool) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """What (pixel - mean) / std becomes after torchvision's `transform_input`, which maps ImageNet-normalised
    inputs to (pixel - 0.5) / 0.5 with ImageNet's constants: x * S / 0.5 + (M - 0.5) / 0.5, again a
    normalisation, with mean m - (M - 0.5) s / S and std 0.5 s / S."""
    if not transform_input:
        return tuple(mean), tuple(std)
    return (tuple(m - (big_m - 0.5) * s / big_s for m, s, big_m, big_s in zip(mean, std, IMAGENET_MEAN, IMAGENET_STD)),
            tuple(0.5 * s / big_s for s, big_s in zip(std, IMAGENET_STD)))


def _close(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) < 1e-4 for x, y in zip(a, b))


@dataclass(frozen=True)
class InputDecision:
    transform_input: bool | None
    lines: list[str]


def decide_transform_input(expects: ExpectedInput, normalisation: tuple[Sequence[float], Sequence[float]],
                           has_switch: bool) -> InputDecision:
    """`transform_input` that gives the first layer the input it was trained on, from inputs normalised by
    `normalisation` (the new run's mean, std); a warning line naming the fix when no setting can."""
    mean, std = (list(v) for v in normalisation)
    target = expects.first_layer()
    said = f"mean {_fmt(expects.mean)} std {_fmt(expects.std)}" + (
        f", transform_input {str(expects.transform_input).lower()}" if expects.transform_input is not None else "")
    line = f"weights: the input they expect, from {expects.where}: normalised by {said}"
    choices = [False, True] if has_switch else [False]
    chosen = next((c for c in choices if all(_close(a, b) for a, b in zip(first_layer_input(mean, std, c), target))),
                  None)
    if chosen is not None:
        if has_switch:
            line += (f"; this run: transform_input {str(chosen).lower()}" + (
                " (the model turns this run's ImageNet-normalised inputs into the [-1, 1] they were trained on)"
                if chosen else ""))
        return InputDecision(chosen if has_switch else None, [line])
    warning = (f"weights: warning: this run normalises with mean {_fmt(mean)} std {_fmt(std)} (data.mean, data.std), "
               f"the weights were trained on mean {_fmt(expects.mean)} std {_fmt(expects.std)}: the first layer sees "
               "other values than in training; set data.mean and data.std to null to take the weights' values")
    return InputDecision(False if has_switch else None, [line, warning])


def _fmt(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"


@dataclass
class WeightsSource:
    """A state_dict and what is known of it."""

    state: dict[str, torch.Tensor]
    where: str  # what to call it in messages
    arch: str | None = None  # the architecture its spec names (runs, checkpoints, sidecars)
    class_names: list[str] | None = None  # None: unknown (a plain file)
    arch_kwargs: dict[str, Any] = field(default_factory=dict)
    # False: the data may name its classes otherwise (ImageNet's wnids against a user's folder names): rows are
    # carried by name where any name matches, else the head is kept or replaced by its number of classes
    match_names: bool = True
    file: Path | None = None  # the file the tensors were read from
    described_by: Path | None = None  # the spec.json or sidecar that describes it
    unwrapped: list[str] = field(default_factory=list)  # wrapper keys descended into
    prefixes_removed: list[str] = field(default_factory=list)
    preprocessing: dict[str, Any] = field(default_factory=dict)  # recorded: PREPROCESSING_KEYS it gives
    expects: ExpectedInput | None = None  # None: nothing recorded (the registry assumes the architecture's)
    class_labels: list[str] | None = None
    about: Any = None  # a sidecar's `source`
    sub_module: tuple[str, int] | None = None  # (prefix, tensors of the file left out): see _choose_sub_module
    # Reads `state` when it is first needed (a download: after the data are read, whose errors come first).
    pending: Callable[[], dict[str, torch.Tensor]] | None = None

    def load(self) -> "WeightsSource":
        """The tensors, read now if they were left for later."""
        if self.pending is not None:
            self.state, self.pending = self.pending(), None
        return self

    def notes(self) -> list[str]:
        lines = [f"weights: unwrapped from {key!r} (the file holds more than the weights; the rest is left out)"
                 for key in self.unwrapped]
        lines += [f"weights: key prefix {prefix!r} removed ({WRAPPER_PREFIXES[prefix]})"
                  for prefix in self.prefixes_removed]
        if self.sub_module is not None:
            prefix, left = self.sub_module
            lines.append(f"weights: the tensors under {prefix!r} taken ({left} others in the file left out)")
        return lines


@dataclass
class StateFile:
    state: dict[str, torch.Tensor]
    checkpoint: dict[str, Any]  # our training checkpoint around the weights, or {}
    unwrapped: list[str]
    prefixes_removed: list[str]


def read_state_file(path: Path) -> StateFile:
    """The state_dict in a weights file: a plain one, ours inside a training checkpoint (the weights the
    run keeps: `ema.inference` gives the average), or another tool's inside a wrapper, prefixes removed."""
    if not path.is_file():
        raise UserError(f"{path}: weights file not found (give a state_dict .pt/.pth file or a run directory)")
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{path}: not a readable PyTorch weights file ({reason}); it may be truncated: "
                        "copy it again, or give model.pt / checkpoints/best.pt of a run") from None
    if _is_ours(loaded):
        ema = loaded.get("ema")
        state = ema["weights"] if isinstance(ema, dict) and ema.get("inference") else loaded["model"]
        return StateFile(state, loaded, [], [])
    state, unwrapped = loaded, []
    while isinstance(state, dict) and not _is_state_dict(state) and len(unwrapped) < 3:
        key = next((k for k in WRAPPER_KEYS if isinstance(state.get(k), dict)), None)
        if key is None:
            break
        state = state[key]
        unwrapped.append(key)
    if not _is_state_dict(state):
        listed = ", ".join(repr(k) for k in list(state)[:8]) if isinstance(state, dict) else ""
        raise UserError(f"{path}: expected a state_dict (dict of tensors), got {type(state).__name__}"
                        + (f" with keys {listed}; none of {', '.join(WRAPPER_KEYS)} holds the weights" if listed else ""))
    state, prefixes = strip_wrapper_prefixes(state)
    return StateFile(state, {}, unwrapped, prefixes)


def _is_ours(loaded: Any) -> bool:
    """A training checkpoint `inceptionlab train` wrote (checkpoint.training_checkpoint): weights and spec."""
    return isinstance(loaded, dict) and isinstance(loaded.get("model"), dict) and "spec" in loaded


def _is_state_dict(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and all(isinstance(v, torch.Tensor) for v in value.values())


def strip_wrapper_prefixes(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """`state` with WRAPPER_PREFIXES removed where every key starts with one (DDP around a compiled model
    gives both), and which were removed. A prefix on some keys only is a sub-module's name: kept."""
    removed: list[str] = []
    while True:
        prefix = next((p for p in WRAPPER_PREFIXES if all(k.startswith(p) for k in state)), None)
        if prefix is None:
            return state, removed
        state = {k[len(prefix):]: v for k, v in state.items()}
        removed.append(prefix)


def read_state_dict(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(state_dict, our checkpoint around it or {}) from a weights file: see `read_state_file`."""
    found = read_state_file(path)
    return found.state, found.checkpoint


def source_from_path(path: Path) -> WeightsSource:
    """A run directory or a weights file, with what its run, its checkpoint or its sidecar records."""
    if path.is_dir():
        run = RunDir.open(path)
        return _with_run_spec(_from_file(run.weights_for_inference()), run.spec_file, f"run {path}")
    source = _from_file(path)
    run = _enclosing_run(path)
    if run is not None:
        return _with_run_spec(source, run.spec_file, f"run {run.path}")
    if source.described_by is None and _sidecar(path).is_file():
        return _with_sidecar(source, _sidecar(path))
    return source


def _from_file(path: Path) -> WeightsSource:
    found = read_state_file(path)
    source = WeightsSource(found.state, str(path), file=path, unwrapped=found.unwrapped,
                           prefixes_removed=found.prefixes_removed)
    if "spec" in found.checkpoint:
        _describe(source, ModelSpec.from_dict(json.loads(found.checkpoint["spec"])), path,
                  f"{path} (the checkpoint's spec)")
    return source


def _enclosing_run(path: Path) -> RunDir | None:
    """The run a file lies in: RUN/model.pt, RUN/checkpoints/*.pt."""
    for folder in (path.parent, path.parent.parent if path.parent.name == "checkpoints" else None):
        if folder is not None and RunDir.is_run(folder):
            return RunDir(folder)
    return None


def _with_run_spec(source: WeightsSource, spec_file: Path, what: str) -> WeightsSource:
    _describe(source, ModelSpec.load(spec_file), spec_file, str(spec_file))
    source.where = f"{source.file} ({what})"
    return source


def _describe(source: WeightsSource, spec: ModelSpec, described_by: Path, where: str) -> None:
    source.arch, source.class_names, source.class_labels = spec.arch, list(spec.class_names), spec.class_labels
    source.arch_kwargs, source.described_by = dict(spec.arch_kwargs), described_by
    if spec.input_kind == "image":
        source.preprocessing = {key: getattr(spec, key) for key in PREPROCESSING_KEYS}
        source.expects = ExpectedInput(tuple(spec.mean), tuple(spec.std), spec.arch_kwargs.get("transform_input"), where)


def _sidecar(path: Path) -> Path:
    return path.with_suffix(".json")


def read_sidecar(sidecar: Path) -> dict[str, Any]:
    """A sidecar's keys (SIDECAR_KEYS), checked; a one-line error naming the file otherwise."""
    try:
        data = json.loads(sidecar.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{sidecar}: not a readable JSON description of the weights beside it ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"{sidecar}: expected a JSON object with keys among {', '.join(SIDECAR_KEYS)}")
    unknown = sorted(set(data) - set(SIDECAR_KEYS))
    if unknown:
        raise UserError(f"{sidecar}: unknown key {unknown[0]!r}; a weights sidecar takes {', '.join(SIDECAR_KEYS)}")
    for key in ("mean", "std"):
        if key in data and not (isinstance(data[key], list) and data[key]
                                and all(isinstance(v, (int, float)) for v in data[key])):
            raise UserError(f"{sidecar}: {key} must be a list of numbers, one per channel")
    if ("mean" in data) != ("std" in data):
        raise UserError(f"{sidecar}: give mean and std together (the normalisation the weights were trained on)")
    return data


def _with_sidecar(source: WeightsSource, sidecar: Path) -> WeightsSource:
    data = read_sidecar(sidecar)
    source.described_by, source.about = sidecar, data.get("source")
    source.arch = data.get("arch")
    source.class_names, source.class_labels = data.get("class_names"), data.get("class_labels")
    source.preprocessing = {key: data[key] for key in PREPROCESSING_KEYS if key in data}
    if "transform_input" in data:
        source.arch_kwargs["transform_input"] = bool(data["transform_input"])
    if "mean" in data:
        source.expects = ExpectedInput(tuple(data["mean"]), tuple(data["std"]), data.get("transform_input"),
                                       str(sidecar))
    return source


@dataclass
class Fitted:
    loaded: int  # tensors copied from the source
    lines: list[str]  # what was loaded, kept, replaced, started new, left out
    record: dict[str, Any] = field(default_factory=dict)  # the same, for the run's weights.json


def fit_weights(model: nn.Module, source: WeightsSource, num_classes: int, class_names: list[str] | None,
                name: str) -> Fitted:
    """Copy `source` into `model` (built for the target classes); see the module docstring."""
    source.load()
    target = model.state_dict()
    heads = head_modules(model, num_classes)
    aux = [a for a in AUX_HEAD_ATTRS if isinstance(getattr(model, a, None), nn.Module)]
    # Per-class tensors: the head's and the auxiliary heads' own output layers (AuxLogits.fc, aux1.fc2).
    class_layers = heads + [f"{a}.{h}" for a in aux for h in head_modules(getattr(model, a), num_classes)]
    in_head = lambda key: any(key.startswith(h + ".") for h in heads)  # noqa: E731
    per_class = lambda key: any(key.startswith(h + ".") for h in class_layers)  # noqa: E731
    in_aux = lambda key: key.split(".", 1)[0] in AUX_HEAD_ATTRS  # noqa: E731
    body_keys = [k for k in target if not in_head(k) and not in_aux(k)]
    _choose_sub_module(source, body_keys, in_head, in_aux)
    _check_body(source, target, body_keys, in_head, in_aux, name)
    head_fits = all(k in source.state and source.state[k].shape[1:] == target[k].shape[1:]
                    for k in target if in_head(k))
    source_head = sorted(k for k in source.state if in_head(k))
    counted = next((int(source.state[f"{h}.weight"].shape[0]) for h in heads if f"{h}.weight" in source.state), None)
    rows = _row_map(source, num_classes, class_names, counted) if head_fits else None
    new_state: dict[str, torch.Tensor] = {}
    for key, value in target.items():
        if key not in source.state or (in_head(key) and not head_fits):
            continue  # a head the weights lack (or hold in another form), an auxiliary head: a fresh init
        if per_class(key):
            new_state[key] = _head_tensor(source.state[key], value, rows)
        elif source.state[key].shape == value.shape:
            new_state[key] = source.state[key]
    model.load_state_dict({**target, **new_state})
    counters = sum(1 for k in body_keys if k not in source.state)  # BatchNorm's num_batches_tracked
    lines = [f"weights: {source.where}: {len(new_state)} of {len(target)} tensors loaded"
             + (f" ({counters} BatchNorm step counters absent: they start at 0)" if counters else ""), *source.notes()]
    if head_fits:
        head_line, head_state = _head_line(heads, rows, source, num_classes, class_names, counted)
    else:
        head_state = "new"
        head_line = (f"weights: head {', '.join(heads)} starts new "
                     + ("(the weights have no head)" if not source_head else
                        f"(the weights' {_shown(source_head)} is of another form)"))
    lines.append(head_line)
    for module in aux:
        if not any(k.startswith(module + ".") for k in source.state):
            lines.append(f"weights: {module} starts new (the weights have no auxiliary head)")
    dropped = sorted({k.split(".", 1)[0] for k in source.state if in_aux(k) and k not in target})
    if dropped:
        lines.append(f"weights: {', '.join(dropped)} left out (model.aux_loss_weight is null)")
    record = {"loaded": len(new_state), "tensors": len(target), "head": head_state,
              "rows_carried": sum(r is not None for r in rows) if rows is not None else 0}
    return Fitted(len(new_state), lines, record)


def _check_body(source: WeightsSource, target: dict[str, torch.Tensor], body_keys: list[str], in_head: Any,
                in_aux: Any, name: str) -> None:
    missing = [k for k in body_keys if k not in source.state and not k.endswith("num_batches_tracked")]
    extra = [k for k in source.state if k not in target and not in_head(k) and not in_aux(k)]
    shape = [k for k in body_keys if k in source.state and source.state[k].shape != target[k].shape]
    if missing or extra or shape:
        firsts = "; ".join(f"first {what}: {keys[0]}" for what, keys in
                           (("missing", missing), ("unexpected", extra), ("of another shape", shape)) if keys)
        raise UserError(f"{source.where}: weights do not fit {name} ({len(missing)} tensors missing, "
                        f"{len(extra)} unexpected, {len(shape)} of another shape; {firsts}); "
                        f"is it a {source.arch or 'different'} model? set model.name to the model it was trained as")


def _choose_sub_module(source: WeightsSource, body_keys: list[str], in_head: Any, in_aux: Any) -> None:
    """Where the whole file does not hold the body but the tensors under one prefix do (a self-supervised
    checkpoint's `backbone.` or `encoder_q.`), take those and say so; of several, the one SUB_MODULES prefers."""
    needed = [k for k in body_keys if not k.endswith("num_batches_tracked")]
    if all(k in source.state for k in needed):
        return
    fitting: dict[str, dict[str, torch.Tensor]] = {}
    for prefix in sorted({".".join(k.split(".")[:depth]) + "." for k in source.state for depth in (1, 2)
                          if k.count(".") >= depth}):
        inner = {k[len(prefix):]: v for k, v in source.state.items() if k.startswith(prefix)}
        if all(k in inner for k in needed) and all(k in body_keys or in_head(k) or in_aux(k) for k in inner):
            fitting[prefix] = inner
    if not fitting:
        return  # _check_body says what does not fit
    named = lambda prefix: prefix.rstrip(".").rsplit(".", 1)[-1]  # noqa: E731
    chosen = next((p for want in SUB_MODULES for p in fitting if named(p) == want), None)
    if chosen is None and len(fitting) > 1:
        raise UserError(f"{source.where}: {len(fitting)} sub-modules hold the whole body "
                        f"({', '.join(fitting)}): save the one to start from as a state_dict of its own")
    chosen = chosen or next(iter(fitting))
    source.sub_module = (chosen, len(source.state) - len(fitting[chosen]))
    source.state = fitting[chosen]


def _shown(keys: list[str]) -> str:
    modules = sorted({k.rsplit(".", 1)[0] for k in keys})
    return ", ".join(modules[:3]) + (f" and {len(modules) - 3} more" if len(modules) > 3 else "")


def _row_map(source: WeightsSource, num_classes: int, class_names: list[str] | None,
             counted: int | None) -> list[int | None] | None:
    """For each target class, the source row it takes (None: a fresh row); None for the whole head: fresh.
    `counted`: the rows of the source's head tensor (its class count where the names are unknown)."""
    if source.class_names is not None and class_names is not None:
        where = {name: i for i, name in enumerate(source.class_names)}
        rows = [where.get(name) for name in class_names]
        if source.match_names or any(row is not None for row in rows):
            return rows
    count = len(source.class_names) if source.class_names is not None else counted
    if count == num_classes or (num_classes == 2 and counted == 1):  # a binary task's one logit
        return list(range(num_classes))
    return None


def _head_tensor(old: torch.Tensor, fresh: torch.Tensor, rows: list[int | None] | None) -> torch.Tensor:
    """The target's head tensor: source rows where `rows` names one, the fresh init elsewhere."""
    if rows is None or old.dim() == 0 or old.shape[1:] != fresh.shape[1:]:
        return fresh
    if fresh.shape[0] != len(rows):  # one logit for two classes (binary): kept only as it was
        return old if rows == list(range(len(rows))) and old.shape == fresh.shape else fresh
    result = fresh.clone()
    for target_row, source_row in enumerate(rows):
        if source_row is not None and source_row < old.shape[0]:
            result[target_row] = old[source_row]
    return result


def _head_line(heads: list[str], rows: list[int | None] | None, source: WeightsSource, num_classes: int,
               class_names: list[str] | None, counted: int | None) -> tuple[str, str]:
    """The head's line, and what happened to it: kept | replaced | new."""
    head = ", ".join(heads)
    if rows is None:
        count = len(source.class_names) if source.class_names is not None else counted
        before = f"{count} classes" if count is not None else "another number of classes"
        return f"weights: head {head} starts new ({before} in the weights, {num_classes} here)", "new"
    carried = [i for i, r in enumerate(rows) if r is not None]
    if len(carried) == num_classes and rows == list(range(num_classes)) and (
            source.class_names is None or len(source.class_names) == num_classes):
        if source.class_names is None:
            return f"weights: head {head} kept ({num_classes} outputs; the weights do not name their classes)", "kept"
        if class_names is None or list(source.class_names) != list(class_names):
            return (f"weights: head {head} kept ({num_classes} outputs; the weights' class names are not the data's: "
                    "taken in the same order)"), "kept"
        return f"weights: head {head} kept (the same {num_classes} classes)", "kept"
    names = class_names or [str(i) for i in range(num_classes)]
    new = [names[i] for i, r in enumerate(rows) if r is None]
    shown = ", ".join(new[:5]) + (f" and {len(new) - 5} more" if len(new) > 5 else "")
    fewer = source.class_names is not None and len(source.class_names) > num_classes
    rest = f", new: {shown}" if new else f" (of the weights' {len(source.class_names)})" if fewer else ", reordered"
    return f"weights: head {head} replaced: {len(carried)} of {num_classes} classes carried over by name{rest}", "replaced"
