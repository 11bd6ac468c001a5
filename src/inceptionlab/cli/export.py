"""`inceptionlab export`: a run's model (or a pretrained one) to ONNX, checked against PyTorch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from inceptionlab.cli import options

# Kept in step with inceptionlab.infer.export.DEFAULT_OPSET (a test checks): importing that module
# here would load torch and ONNX for every command, `--help` included (+2.5 s).
DEFAULT_OPSET = 20


def export(
    run_dir: Optional[Path] = options.run_argument("A run directory (writes RUN_DIR/exports/model.onnx)."),
    run: Optional[Path] = options.run_option(),
    model: Optional[str] = options.model_option(),
    weights: Optional[str] = options.weights_option(),
    opset: int = typer.Option(DEFAULT_OPSET, "--opset", help="ONNX opset (18 or newer)."),
    dynamic_batch: bool = typer.Option(True, "--dynamic-batch/--static-batch",
                                       help="Dynamic batch axis (default) or fixed batch 1."),
    out: Path = typer.Option(Path("runs/exports"), "--out", help="--model: exports go to OUT/<name>/."),
    images: List[Path] = typer.Option(
        [], "--images", help="Images/folders for the parity check (default: the guide's sample pictures "
                             "and the run's val data)."),
    as_json: bool = options.json_option("one object with path, sidecar, opset, parity"),
) -> None:
    """Export to ONNX (eval mode, no aux head, input `images`, output `logits`) with a sidecar
    model.onnx.json (classes, preprocessing, opset, weights checksum), after checking ONNX Runtime
    against PyTorch on real images. Fails, writing nothing, if they disagree (rel. error > 1e-3 or a
    top-1 flip that rounding cannot explain).

    Examples:

      inceptionlab export runs/inception_v3/imagefolder/20261122-101500

      inceptionlab export --model inception_v3 --weights random --out runs/exports

      inceptionlab export --model resnet50 --static-batch --opset 18 --json
    """
    from inceptionlab.infer.export import export_onnx, load_source

    run = options.pick_run(run_dir, run)
    options.pick_source(run, model)
    source = load_source(run, model, weights, out)
    result = export_onnx(source, opset=opset, dynamic_batch=dynamic_batch, images=list(images) or None)
    if as_json:
        print(json.dumps(result.to_dict()))
        return
    meta = result.metadata
    print(f"exported {result.path} ({result.bytes / 1e6:.1f} MB, opset {opset}, "
          f"{meta['input']['name']} {meta['input']['shape']} -> {meta['output']['name']} {meta['output']['shape']}, "
          f"{result.seconds:.1f} s)")
    print(result.parity.describe())
    print(f"sidecar {result.sidecar}")


def register(root: typer.Typer) -> None:
    root.command("export")(export)
