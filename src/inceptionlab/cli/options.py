"""Option definitions shared by every command: one name, one default, one help text per option.

A run directory is given the same way everywhere: positionally (`inceptionlab evaluate RUN_DIR`) or
as `--run RUN_DIR` (the only way in `predict`, whose positional arguments are the images); a
pretrained model is `--model NAME`, its weights `--weights`.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Optional

import typer

from inceptionlab.errors import UserError

# Kept in step with runtime.DEVICE_HELP (a test checks): importing runtime here would load torch for `--help`.
DEVICE_HELP = "auto, cpu, cuda or cuda:N (a ROCm GPU is 'cuda' too)"
WEIGHTS_HELP = ("with --model: imagenet (the torch hub cache, default), random (seed 0) or a state_dict file; "
                "with a run: a weights file or checkpoint instead of its model.pt")


def run_argument(what: str = "A run directory made by `inceptionlab train`.") -> Any:
    return typer.Argument(None, help=what, show_default=False)


def run_option() -> Any:
    return typer.Option(None, "--run", help="A run directory made by `inceptionlab train` (same as RUN_DIR).",
                        show_default=False)


def model_option(what: str = "a pretrained torchvision model instead of a run, e.g. inception_v3") -> Any:
    return typer.Option(None, "--model", help=what[0].upper() + what[1:] + ".", show_default=False)


def weights_option() -> Any:
    return typer.Option(None, "--weights", help=WEIGHTS_HELP[0].upper() + WEIGHTS_HELP[1:] + ".", show_default=False)


def device_option() -> Any:
    return typer.Option("auto", "--device", help=f"Where to run: {DEVICE_HELP}.")


def json_option(what: str) -> Any:
    return typer.Option(False, "--json", help=f"Machine-readable output: {what}.")


def batch_size_option(default: int) -> Any:
    return typer.Option(default, "--batch-size", min=1, help="Images per forward pass.")


def num_workers_option() -> Any:
    return typer.Option(None, "--num-workers", min=0, help="Loader worker processes (default: min(8, CPU cores)).")


# Kept in step with models/tta.py's TTA_VIEWS (a test checks): importing it here would load torch for `--help`.
TTA_MODES = ("none", "flip", "crops", "flip-crops")


def tta_option(default_source: str = "the decision rule's own (spec.json; none if unset); a rule fitted by "
               "`evaluate` refuses another (fit it under the new one: evaluate RUN --tta MODE)") -> Any:
    return typer.Option(None, "--tta", help="Test-time augmentation: none, flip (2 views), crops (the image and "
                        "its 4 corner crops), flip-crops (10 views); logits averaged over the views. "
                        f"Default: {default_source}.", show_default=False)


def check_tta(value: Optional[str]) -> Optional[str]:
    if value is not None and value not in TTA_MODES:
        raise UserError(f"--tta {value!r}: use one of {', '.join(TTA_MODES)}")
    return value


def pick_run(positional: Optional[Path], option: Optional[Path]) -> Optional[Path]:
    """The run directory from RUN_DIR or --run (the same thing; both given must agree)."""
    if positional is not None and option is not None and Path(positional) != Path(option):
        raise UserError(f"two run directories given ({positional} and --run {option}): give one")
    return positional if positional is not None else option


def pick_source(run: Optional[Path], model: Optional[str]) -> None:
    """Exactly one of a run directory and --model NAME."""
    if (run is None) == (model is None):
        raise UserError("give a run directory (RUN_DIR or --run RUN_DIR) or --model NAME, one of them")


DEFAULT_EXPORTS = Path("runs/exports")  # where a --model's exports go unless --out says


def exports_folder(run: Optional[Path], out: Optional[Path]) -> Path:
    """`--out` of export and bench: the folder of a --model's exports; refused with a run, whose export
    is RUN_DIR/exports/ (serve and bench read it there), rather than ignored."""
    if run is not None and out is not None:
        raise UserError(f"--out {out}: a run's export goes to {run}/exports/ (serve and bench read it there); "
                        "copy model.onnx and model.onnx.json from there, or give --model NAME to export elsewhere")
    return out or DEFAULT_EXPORTS


def canonical_command(ctx: Any, skip: tuple[str, ...] = ()) -> str:
    """The call with every option spelled out (defaults too), so rerunning it reproduces a result row.

    Built from click's parsed parameters rather than a hand-kept list, so no option can be left out.
    """
    parts: list[str] = []
    for param in ctx.command.params:
        if param.name in skip or param.name not in ctx.params:
            continue
        value = ctx.params[param.name]
        if param.param_type_name == "argument":  # typer's parameters need not be click's own classes
            parts += [str(v) for v in (value if isinstance(value, (list, tuple)) else [value]) if v is not None]
        else:
            parts += _option_words(param, value)
    return " ".join([ctx.command_path, *(shlex.quote(part) for part in parts)])


def _option_words(param: Any, value: Any) -> list[str]:
    names = [n for n in param.opts if n.startswith("--")] or list(param.opts)
    if param.is_flag and param.secondary_opts:  # --plot/--no-plot
        return [names[0] if value else param.secondary_opts[0]]
    if param.is_flag:
        return [names[0]] if value else []
    if value is None:
        return []
    values = value if isinstance(value, (list, tuple)) else [value]
    return [word for v in values for word in (names[0], str(v))]
