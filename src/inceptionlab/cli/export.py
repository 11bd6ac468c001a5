"""`inceptionlab export`: a run's model (or a pretrained one) to ONNX, checked against PyTorch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from inceptionlab.cli import options
from inceptionlab.errors import UserError
from inceptionlab.infer.opsets import DEFAULT_OPSET, MIN_OPSET


def export(
    run_dir: Optional[Path] = options.run_argument("A run directory (writes RUN_DIR/exports/model.onnx)."),
    run: Optional[Path] = options.run_option(),
    model: Optional[str] = options.model_option(),
    weights: Optional[str] = options.weights_option(),
    opset: int = typer.Option(DEFAULT_OPSET, "--opset", help=f"ONNX opset ({MIN_OPSET} or newer)."),
    dynamic_batch: bool = typer.Option(True, "--dynamic-batch/--static-batch",
                                       help="Dynamic batch axis (default) or fixed batch 1."),
    out: Optional[Path] = typer.Option(None, "--out", help="--model: exports go to OUT/<name>/ (default: "
                                       "runs/exports). A run's export goes to RUN_DIR/exports/, where serve and "
                                       "bench find it."),
    images: List[Path] = typer.Option(
        [], "--images", help="Images/folders for the parity check (default: the guide's sample pictures "
                             "and the run's val data)."),
    as_json: bool = options.json_option("one object with path, sidecar, opset, parity"),
    format: str = typer.Option("onnx", "--format", help="onnx, or triton: also a Triton model repository "
                                                        "(exports/triton/) and a KServe manifest (exports/kserve.yaml)."),
    name: Optional[str] = typer.Option(None, "--name", help="triton: model name (default: ARCH_RUNFOLDER for a run, "
                                                            "e.g. resnet18_20261122-101500, so runs never collide; "
                                                            "the architecture for --model)."),
    max_batch: int = typer.Option(32, "--max-batch", help="triton: max_batch_size."),
    max_delay_ms: float = typer.Option(2.0, "--max-delay-ms", help="triton: longest wait for a batch to fill."),
    max_queue: int = typer.Option(256, "--max-queue", help="triton: queued requests beyond this are rejected."),
    instances: int = typer.Option(1, "--instances", help="triton: model instances (instance_group count)."),
    accelerator: str = typer.Option("none", "--accelerator", help="triton: none | openvino (CPU) | cuda | "
                                                                 "tensorrt | migraphx (AMD ROCm build)."),
    storage_uri: Optional[str] = typer.Option(None, "--storage-uri", help="triton: where the repository will "
                                                                          "live, for the KServe manifest."),
) -> None:
    """Export to ONNX, checked against PyTorch on real images.
    The model is exported in eval mode without its aux head (input `images`, output `logits`), beside a
    sidecar model.onnx.json (classes, preprocessing, opset, weights checksum). Fails, writing nothing,
    if ONNX Runtime and PyTorch disagree (rel. error > 1e-3 or a top-1 flip that rounding cannot explain).

    Examples:

      inceptionlab export runs/inception_v3/imagefolder/20261122-101500

      inceptionlab export --model inception_v3 --weights random --out runs/exports

      inceptionlab export --model resnet50 --static-batch --opset 18 --json

      inceptionlab export RUN_DIR --format triton --max-batch 16 --instances 2 --accelerator openvino
    """
    if format not in ("onnx", "triton"):
        raise UserError(f"--format {format}: use onnx or triton")
    if format == "triton" and not dynamic_batch:
        raise UserError("--format triton batches requests dynamically: drop --static-batch")
    triton = _triton_options(format, name, max_batch, max_delay_ms, max_queue, instances, accelerator, storage_uri)
    # start-up time: torch (~1-2 s) loads when the command runs, never for `inceptionlab --help`
    from inceptionlab.infer.export import export_onnx
    from inceptionlab.infer.source import load_source
    from inceptionlab.infer.triton import default_model_name, write_triton_repository

    run = options.pick_run(run_dir, run)
    options.pick_source(run, model)
    source = load_source(run, model, weights, options.exports_folder(run, out))
    result = export_onnx(source, opset=opset, dynamic_batch=dynamic_batch, images=list(images) or None)
    repository = None
    if triton is not None:
        triton.name = triton.name or default_model_name(source.spec.arch, source.run_dir)
        repository = write_triton_repository(result.path, source.spec, source.exports / "triton", triton, opset)
    if as_json:
        print(json.dumps({**result.to_dict(), **({"triton": repository.to_dict()} if repository else {})}))
        return
    meta = result.metadata
    print(f"exported {result.path} ({result.bytes / 1e6:.1f} MB, opset {opset}, "
          f"{meta['input']['name']} {meta['input']['shape']} -> {meta['output']['name']} {meta['output']['shape']}, "
          f"{result.seconds:.1f} s)")
    print(result.parity.describe())
    weights = meta["spec"].get("weights", "raw")
    print(f"sidecar {result.sidecar}; weights: {'the average of the trained weights (EMA)' if weights == 'ema' else 'as trained'}")
    if repository is not None:
        print(f"triton model repository {repository.root} (model {repository.name}: {repository.config}); "
              f"KServe InferenceService {repository.kserve}")
        print(repository.note)
        for old in repository.removed:
            print(f"removed the earlier export {old} from the repository (Triton would have loaded it too)")


def _triton_options(format, name, max_batch, max_delay_ms, max_queue, instances, accelerator, storage_uri):
    """Checked before the (slow) export, so a typo fails at once."""
    if format != "triton":
        return None
    from inceptionlab.infer.triton import DEFAULT_STORAGE_URI, TritonOptions  # start-up time: torch, as in export()

    options = TritonOptions(name, max_batch, max_delay_ms, max_queue, instances, accelerator,
                            storage_uri or DEFAULT_STORAGE_URI)
    options.check()
    return options


def register(root: typer.Typer) -> None:
    root.command("export")(export)
