"""Starting weights for a model: a weights file or a run directory, fitted onto the model a recipe builds.

`model.weights` may name a plain state_dict (`model.pt`, a torchvision `.pth`), a training checkpoint
(`last.pt`, `best.pt`: its spec says the architecture and classes) or a run directory (its `spec.json`
does, and its inference weights are loaded). The body must fit exactly; the heads follow the classes:

- the same classes in the same order: the head is kept as is;
- other classes, the source's class names known (a run, a checkpoint): the head is replaced, and the
  rows of the classes both have are carried over by name (a run continued with new classes keeps
  what it learnt of the old ones);
- the names unknown (a plain file, ImageNet's labels against folder names): kept when the number of
  classes is the same, replaced otherwise.

Auxiliary heads the model has and the weights lack start new; ones the weights have and the model
drops (model.aux_loss_weight null) are left out. Every decision is reported in one line each.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from inceptionlab.checkpoint import RunDir
from inceptionlab.errors import UserError
from inceptionlab.models.parts import AUX_HEAD_ATTRS, head_modules
from inceptionlab.models.spec import ModelSpec


@dataclass
class WeightsSource:
    """A state_dict and what is known of it."""

    state: dict[str, torch.Tensor]
    where: str  # what to call it in messages
    arch: str | None = None  # the architecture its spec names (runs, checkpoints)
    class_names: list[str] | None = None  # None: unknown (a plain file)
    arch_kwargs: dict[str, Any] = field(default_factory=dict)
    match_names: bool = True  # False: the names are labels of another kind (ImageNet's), compare counts only


def read_state_dict(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(state_dict, the checkpoint around it or {}) from a weights file or a training checkpoint.

    A checkpoint whose EMA weights are the run's weights (`ema.inference`) gives those."""
    if not path.is_file():
        raise UserError(f"{path}: weights file not found (give a state_dict .pt/.pth file or a run directory)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{path}: not a readable PyTorch weights file ({reason}); it may be truncated: "
                        "copy it again, or give model.pt / checkpoints/best.pt of a run") from None
    checkpoint: dict[str, Any] = {}
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        checkpoint = state  # a training checkpoint: take the weights the run keeps
        ema = state.get("ema")
        state = ema["weights"] if isinstance(ema, dict) and ema.get("inference") else state["model"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"{path}: expected a state_dict (dict of tensors), got {type(state).__name__}")
    return state, checkpoint


def source_from_path(path: Path) -> WeightsSource:
    """A run directory or a weights file, with the architecture and classes its spec gives."""
    if path.is_dir():
        run = RunDir.open(path)
        spec = ModelSpec.load(run.spec_file)
        weights = run.weights_for_inference()
        state, _ = read_state_dict(weights)
        return WeightsSource(state, f"{weights} (run {path})", spec.arch, list(spec.class_names), dict(spec.arch_kwargs))
    state, checkpoint = read_state_dict(path)
    if "spec" in checkpoint:
        spec = ModelSpec.from_dict(json.loads(checkpoint["spec"]))
        return WeightsSource(state, str(path), spec.arch, list(spec.class_names), dict(spec.arch_kwargs))
    return WeightsSource(state, str(path))


@dataclass
class Fitted:
    loaded: int  # tensors copied from the source
    lines: list[str]  # what was loaded, kept, replaced, started new, left out


def fit_weights(model: nn.Module, source: WeightsSource, num_classes: int, class_names: list[str] | None,
                name: str) -> Fitted:
    """Copy `source` into `model` (built for the target classes); see the module docstring."""
    target = model.state_dict()
    heads = head_modules(model, num_classes)
    aux = [a for a in AUX_HEAD_ATTRS if isinstance(getattr(model, a, None), nn.Module)]
    # Per-class tensors: the head's and the auxiliary heads' own output layers (AuxLogits.fc, aux1.fc2).
    class_layers = heads + [f"{a}.{h}" for a in aux for h in head_modules(getattr(model, a), num_classes)]
    in_head = lambda key: any(key.startswith(h + ".") for h in heads)  # noqa: E731
    per_class = lambda key: any(key.startswith(h + ".") for h in class_layers)  # noqa: E731
    in_aux = lambda key: key.split(".", 1)[0] in AUX_HEAD_ATTRS  # noqa: E731
    body_missing = [k for k in target if k not in source.state and not in_aux(k)]
    body_extra = [k for k in source.state if k not in target and not in_aux(k)]
    body_shape = [k for k in target if k in source.state and not in_head(k) and not in_aux(k)
                  and source.state[k].shape != target[k].shape]
    if body_missing or body_extra or body_shape:
        first = (body_missing or body_extra or body_shape)[0]
        what = "missing" if body_missing else "unexpected" if body_extra else "of another shape"
        raise UserError(f"{source.where}: weights do not fit {name} ({len(body_missing)} tensors missing, "
                        f"{len(body_extra)} unexpected, {len(body_shape)} of another shape; first {what}: {first}); "
                        f"is it a {source.arch or 'different'} model? set model.name to the model it was trained as")
    counted = next((int(source.state[f"{h}.weight"].shape[0]) for h in heads if f"{h}.weight" in source.state), None)
    rows = _row_map(source, num_classes, class_names, counted)
    new_state, lines = {}, []
    for key, value in target.items():
        if key not in source.state:
            continue  # an auxiliary head the source lacks: keeps its fresh init
        if per_class(key):
            new_state[key] = _head_tensor(source.state[key], value, rows)
        elif source.state[key].shape == value.shape:
            new_state[key] = source.state[key]
    model.load_state_dict({**target, **new_state})
    lines.append(f"weights: {source.where}: {len(new_state)} of {len(target)} tensors loaded")
    lines.append(_head_line(heads, rows, source, num_classes, class_names, counted))
    for module in aux:
        if not any(k.startswith(module + ".") for k in source.state):
            lines.append(f"weights: {module} starts new (the weights have no auxiliary head)")
    dropped = sorted({k.split(".", 1)[0] for k in source.state if in_aux(k) and k not in target})
    if dropped:
        lines.append(f"weights: {', '.join(dropped)} left out (model.aux_loss_weight is null)")
    return Fitted(len(new_state), lines)


def _row_map(source: WeightsSource, num_classes: int, class_names: list[str] | None,
             counted: int | None) -> list[int | None] | None:
    """For each target class, the source row it takes (None: a fresh row); None for the whole head: fresh.
    `counted`: the rows of the source's head tensor (its class count where the names are unknown)."""
    if source.class_names is not None and source.match_names and class_names is not None:
        where = {name: i for i, name in enumerate(source.class_names)}
        return [where.get(name) for name in class_names]
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
               class_names: list[str] | None, counted: int | None) -> str:
    head = ", ".join(heads)
    if rows is None:
        count = len(source.class_names) if source.class_names is not None else counted
        before = f"{count} classes" if count is not None else "another number of classes"
        return f"weights: head {head} starts new ({before} in the weights, {num_classes} here)"
    carried = [i for i, r in enumerate(rows) if r is not None]
    if len(carried) == num_classes and rows == list(range(num_classes)) and (
            source.class_names is None or len(source.class_names) == num_classes):
        if source.class_names is None or not source.match_names:
            return f"weights: head {head} kept ({num_classes} outputs; the weights do not name their classes)"
        return f"weights: head {head} kept (the same {num_classes} classes)"
    names = class_names or [str(i) for i in range(num_classes)]
    new = [names[i] for i, r in enumerate(rows) if r is None]
    shown = ", ".join(new[:5]) + (f" and {len(new) - 5} more" if len(new) > 5 else "")
    return (f"weights: head {head} replaced: {len(carried)} of {num_classes} classes carried over by name"
            + (f", new: {shown}" if new else ", reordered"))
