"""ONNX export, checked every time against PyTorch on real images (timm's onnx_export + check idea).

    source = load_source(run_dir=Path("runs/.../20261122-101500"))     # or model="inception_v3"
    result = export_onnx(source)            # RUN_DIR/exports/model.onnx + model.onnx.json

The exported graph is the model in eval mode with its auxiliary head removed: one input `images`
(float32 NCHW, already resized, cropped and normalised as the spec says) and one output `logits`.
The batch axis is dynamic unless asked otherwise. Nothing is written until ONNX Runtime has run the
new graph on real images and agreed with PyTorch within PARITY_RTOL; the file and its sidecar are
then written atomically (temporary file + rename), so a failed or interrupted export leaves the
previous export in place.

The sidecar `model.onnx.json` carries the model spec (classes, preprocessing), the opset, the
checksum of the weights the graph came from, and the parity figures. `bench` reuses an export only
while that checksum matches the weights it would export now.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from inceptionlab.checkpoint import RunDir
from inceptionlab.config import load_recipe
from inceptionlab.data.io.decode import ImageReadError, load_rgb
from inceptionlab.data.io.image_files import expand_image_paths
from inceptionlab.data.readers import READERS
from inceptionlab.engine.task import main_logits
from inceptionlab.errors import UserError
from inceptionlab.fileio import atomic_write_bytes, atomic_write_json
from inceptionlab.host import package_versions
from inceptionlab.models.registry import build_model, drop_aux_heads, load_run_model, pretrained_spec
from inceptionlab.models.spec import ModelSpec

INPUT_NAME = "images"
OUTPUT_NAME = "logits"
# torch 2.14's exporter (torch.export + onnxscript) emits opset 20 by default and can convert down
# to 18, its lowest; ONNX Runtime 1.31 and OpenVINO 2026 read both.
DEFAULT_OPSET = 20
MIN_OPSET = 18
# Parity: fp32 ONNX Runtime (MLAS) and PyTorch (oneDNN) sum in different orders; on Inception v3 at
# 299 px they differ by ~1e-6 of the largest logit. 1e-3 of it is far above that noise and far below
# a real conversion bug (a wrong op, a missing normalisation, a dropped layer: errors of order 1).
PARITY_RTOL = 1e-3
PARITY_IMAGES = 32  # Inception v3 at 299 px: ~5 s for both runtimes on 2 cores
SAMPLE_IMAGES_ENV = "INCEPTIONLAB_SAMPLE_IMAGES"
# The guide's five ImageNet pictures in shared/ beside the repository, found from this file rather
# than the working directory (override with INCEPTIONLAB_SAMPLE_IMAGES).
DEFAULT_SAMPLE_IMAGES = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "imagenet-sample" / "images"
RANDOM_SEED = 0
ONNX_EXTRA = "pip install 'inceptionlab[onnx]'"


# --------------------------------------------------------------------------------------- sources


@dataclass
class ModelSource:
    """A model to export or benchmark: the module in eval mode, its spec and where it came from."""

    model: nn.Module
    spec: ModelSpec
    label: str  # run directory or model name, for messages and result rows
    weights: str  # "run:<file>", "imagenet", "random" or a state_dict path
    weights_sha256: str  # of the loaded tensors (names, shapes, bytes): names the exact weights
    home: Path  # exports/ and bench/ live here: the run directory, or --out/<name>
    run_dir: Path | None = None

    @property
    def exports(self) -> Path:
        return self.home / "exports" if self.run_dir is not None else self.home

    @property
    def onnx_file(self) -> Path:
        return self.exports / "model.onnx"

    @property
    def cache(self) -> Path:
        """Tuned and compiled artifacts (ORT optimized models, int8 models, engine caches)."""
        return self.exports / "cache"

    @property
    def bench_results(self) -> Path:
        return self.home / "bench" / "results.jsonl"


def state_checksum(model: nn.Module) -> str:
    """sha256 over the state_dict's names, dtypes, shapes and bytes (~0.1 s for Inception v3's 95 MB)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)}".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return digest.hexdigest()


def _drop_aux(model: nn.Module) -> nn.Module:
    """Eval mode already ignores Inception's aux head; removing it keeps its weights out of exports."""
    drop_aux_heads(model)
    return model.eval()


def load_source(run_dir: Path | None = None, model: str | None = None, weights: str | None = None,
                out: Path = Path("runs/exports")) -> ModelSource:
    """The model of a run directory (its model.pt, or `weights`), or a torchvision model with
    `weights` imagenet (default: the torch hub cache), random (seed 0) or a state_dict file."""
    if (run_dir is None) == (model is None):
        raise UserError("give either a run directory or --model NAME (not both)")
    if run_dir is not None:
        return _run_source(Path(run_dir), Path(weights) if weights else None)
    return _model_source(model, weights or "imagenet", Path(out))  # type: ignore[arg-type]


def _run_source(run_dir: Path, weights: Path | None) -> ModelSource:
    spec = ModelSpec.load(RunDir.open(run_dir).spec_file)
    if spec.input_kind != "image":
        raise UserError(f"{run_dir}: a {spec.arch} model takes {spec.input_kind}, not images: ONNX export and bench "
                        "take image classifiers; training already wrote this run's export, a torch.export package "
                        f"that classifies raw text: {Path(run_dir) / 'exports' / 'text'}/ (python classify.py \"some review\")")
    net, spec = load_run_model(run_dir, weights)
    path = weights or RunDir.open(run_dir).weights_for_inference()
    net = _drop_aux(net)
    return ModelSource(net, spec, str(run_dir), f"run:{path}", state_checksum(net), run_dir, run_dir)


def _model_source(name: str, weights: str, out: Path) -> ModelSource:
    spec = pretrained_spec(name)
    if weights == "random":
        # Latency does not depend on the values; seed 0 makes the same "random" model every time.
        torch.manual_seed(RANDOM_SEED)
        built = build_model(name, spec.num_classes, None)
        spec.arch_kwargs = dict(built.arch_kwargs)
    else:
        built = build_model(name, spec.num_classes, weights)
    net = _drop_aux(built.model)
    return ModelSource(net, spec, name, weights, state_checksum(net), out / name)


# --------------------------------------------------------------------------------------- images


def sample_image_dir() -> Path:
    return Path(os.environ.get(SAMPLE_IMAGES_ENV, DEFAULT_SAMPLE_IMAGES))


def run_val_images(run_dir: Path | None) -> list[Path]:
    """The run's validation images (from its recipe), or [] when the data has moved or is arrays."""
    if run_dir is None or not (Path(run_dir) / "recipe.resolved.yaml").is_file():
        return []

    try:
        data = load_recipe(Path(run_dir) / "recipe.resolved.yaml", []).data
        reader = READERS.get(data.reader)
        if reader is None:  # array datasets (CIFAR-10, MNIST) have no image files
            return []
        files, _ = expand_image_paths([reader.root(data) / data.val_split])
    except UserError:
        return []
    return files


def default_image_files(source: ModelSource) -> list[Path]:
    """Real images to check and calibrate on: the guide's sample pictures, then the run's val data."""
    sample_dir = sample_image_dir()
    sample: list[Path] = []
    if sample_dir.is_dir():
        sample = expand_image_paths([sample_dir])[0]
    return sample + run_val_images(source.run_dir)


def image_files(folders: list[Path] | None, source: ModelSource) -> list[Path]:
    if not folders:
        return default_image_files(source)

    files, errors = expand_image_paths(list(folders))
    if errors:
        where, message = errors[0]
        raise UserError(f"{where}: {message}; pass a folder of images with --images")
    return files


def spread(files: list[Path], count: int) -> list[Path]:
    """`count` files spread evenly over the list (every class of a sorted ImageFolder, not the first)."""
    if len(files) <= count:
        return list(files)
    step = len(files) / count
    return [files[int(i * step)] for i in range(count)]


def shuffled(files: list[Path], seed: int = RANDOM_SEED) -> list[Path]:
    files = list(files)
    random.Random(seed).shuffle(files)
    return files


def load_images(files: list[Path], spec: ModelSpec) -> np.ndarray:
    """uint8 NCHW array of the files after the spec's eval transform; unreadable files are skipped."""
    transform = spec.eval_transform()
    images = []
    for path in files:
        try:
            image = load_rgb(path, max_side=spec.resize_size)
            if spec.channels == 1:  # Fashion-MNIST-style models take one grey channel (as predict does)
                image = image.convert("L")
            images.append(torch.as_tensor(transform(image)))
        except (ImageReadError, OSError, ValueError):
            continue
    if not images:
        return np.zeros((0, *spec.input_shape), np.uint8)
    return torch.stack(images).numpy()


def normalize(images: np.ndarray, spec: ModelSpec) -> np.ndarray:
    """uint8 NCHW -> float32 NCHW, (x / 255 - mean) / std: what the exported graph expects."""
    return spec.normalizer()(torch.from_numpy(images)).numpy()


def random_inputs(count: int, shape: tuple[int, ...], seed: int = RANDOM_SEED) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, *shape)).astype(np.float32)


# --------------------------------------------------------------------------------------- parity


@dataclass
class Parity:
    images: int
    real: bool  # False: no real images were found and random inputs were used
    max_abs: float
    max_rel: float  # max |onnx - torch| / max |torch|
    top1_agree: int
    top1_flips_explained: int  # flips where torch's top-1/top-2 margin is below max_abs
    ok: bool
    rtol: float = PARITY_RTOL

    @property
    def agreement(self) -> float:
        return self.top1_agree / max(self.images, 1)

    def describe(self) -> str:
        what = f"{self.images} real images" if self.real else f"{self.images} random inputs (no real images found)"
        return (f"parity on {what}: max abs err {self.max_abs:.2e}, max rel err {self.max_rel:.2e}, "
                f"top-1 agreement {self.agreement:.1%} ({self.top1_agree}/{self.images}) "
                f"[tolerance: rel err <= {self.rtol:g}; top-1 must agree unless within max abs err]")

    def to_dict(self) -> dict[str, Any]:
        return {"images": self.images, "real_images": self.real, "max_abs_err": self.max_abs,
                "max_rel_err": self.max_rel, "top1_agreement": self.agreement, "rtol": self.rtol, "ok": self.ok}


def compare_logits(reference: np.ndarray, candidate: np.ndarray, real: bool, rtol: float = PARITY_RTOL) -> Parity:
    """Max abs/rel error and top-1 agreement; a top-1 flip only passes when torch's own top-1/top-2
    margin is smaller than the error seen (a near tie that fp32 rounding can legitimately flip)."""
    diff = np.abs(reference.astype(np.float64) - candidate.astype(np.float64))
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = max_abs / max(float(np.abs(reference).max()) if reference.size else 0.0, 1e-12)
    agree = reference.argmax(axis=1) == candidate.argmax(axis=1)
    top2 = np.sort(reference, axis=1)[:, -2:] if reference.shape[1] > 1 else np.zeros((len(reference), 2))
    near_tie = (top2[:, 1] - top2[:, 0]) <= max_abs
    explained = int((~agree & near_tie).sum())
    ok = max_rel <= rtol and bool(np.all(agree | near_tie))
    return Parity(len(reference), real, max_abs, max_rel, int(agree.sum()), explained, ok, rtol)


def torch_logits(model: nn.Module, inputs: np.ndarray, batch: int = 16) -> np.ndarray:
    outputs = []
    with torch.inference_mode():
        for start in range(0, len(inputs), batch):
            outputs.append(main_logits(model(torch.from_numpy(inputs[start:start + batch]))).float().numpy())
    return np.concatenate(outputs) if outputs else np.zeros((0, 0), np.float32)


def onnx_logits(model: bytes | Path, inputs: np.ndarray, batch: int | None = 16) -> np.ndarray:
    """Logits from ONNX Runtime's CPU provider (the reference runtime: always installed with the extra)."""
    ort = import_onnxruntime()
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: the CPU provider's notes would drown the output
    session = ort.InferenceSession(model if isinstance(model, bytes) else str(model), options,
                                   providers=["CPUExecutionProvider"])
    fixed = session.get_inputs()[0].shape[0]
    step = fixed if isinstance(fixed, int) else (batch or len(inputs))
    outputs = [session.run([OUTPUT_NAME], {INPUT_NAME: inputs[start:start + step]})[0]
               for start in range(0, len(inputs), step)]
    return np.concatenate(outputs) if outputs else np.zeros((0, 0), np.float32)


def parity_inputs(source: ModelSource, folders: list[Path] | None, count: int = PARITY_IMAGES) -> tuple[np.ndarray, bool]:
    """Normalised real images (sample pictures first, then the run's val data spread over classes)."""
    files = image_files(folders, source)
    sample_dir = sample_image_dir().resolve()
    sample = [f for f in files if f.resolve().parent == sample_dir]
    rest = [f for f in files if f.resolve().parent != sample_dir]
    chosen = sample[:count] + spread(rest, count - len(sample[:count]))
    images = load_images(chosen, source.spec)
    if len(images) == 0:
        return random_inputs(4, source.spec.input_shape), False
    return normalize(images, source.spec), True


# --------------------------------------------------------------------------------------- export


@dataclass
class ExportResult:
    path: Path
    sidecar: Path
    parity: Parity
    opset: int
    dynamic_batch: bool
    bytes: int
    seconds: float
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "sidecar": str(self.sidecar), "opset": self.opset,
                "dynamic_batch": self.dynamic_batch, "bytes": self.bytes, "seconds": round(self.seconds, 2),
                "parity": self.parity.to_dict()}


class _Logits(nn.Module):
    """The graph's one output: main logits (a tuple output, e.g. InceptionOutputs, keeps its first)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return main_logits(self.model(images))


def import_onnxruntime() -> Any:
    try:
        import onnxruntime  # optional extra (onnx): imported on use, not at start-up
    except ImportError:
        raise UserError(f"onnxruntime is not installed: {ONNX_EXTRA}") from None
    return onnxruntime


def _import_onnx() -> Any:
    try:
        import onnx  # optional extra (onnx): imported on use, not at start-up
        import onnxscript  # noqa: F401  (torch.onnx's exporter needs it)
    except ImportError:
        raise UserError(f"onnx/onnxscript are not installed: {ONNX_EXTRA}") from None
    return onnx


def check_opset(opset: int) -> int:
    onnx = _import_onnx()
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise UserError(f"--opset {opset}: the exporter writes opsets {MIN_OPSET}..{newest}; use e.g. {DEFAULT_OPSET}")
    return opset


def trace_to_onnx(model: nn.Module, input_shape: tuple[int, ...], opset: int, dynamic_batch: bool) -> Any:
    """torch.onnx (dynamo) export to an in-memory ModelProto; the exporter's chatter goes to stderr."""
    # Batch 2, not 1: torch.export specialises a size-1 dimension to a constant.
    example = torch.zeros(2 if dynamic_batch else 1, *input_shape)
    dynamic = ({0: torch.export.Dim("batch", min=1, max=4096)},) if dynamic_batch else None
    try:
        with contextlib.redirect_stdout(sys.stderr), torch.inference_mode(False), torch.no_grad():
            program = torch.onnx.export(_Logits(model).eval(), (example,), input_names=[INPUT_NAME],
                                        output_names=[OUTPUT_NAME], opset_version=opset,
                                        dynamic_shapes=dynamic, dynamo=True, verbose=False)
    except Exception as exc:  # the exporter raises many types; the fix is the same
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"torch.onnx could not export this model ({type(exc).__name__}: {first})"[:400]) from None
    return program.model_proto


def _stamp(proto: Any, source: ModelSource) -> None:
    """Spec and weights checksum inside the ONNX file too: the graph describes itself anywhere."""
    for key, value in (("inceptionlab.spec", json.dumps(source.spec.to_dict())),
                       ("inceptionlab.weights_sha256", source.weights_sha256)):
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value


def export_onnx(source: ModelSource, opset: int = DEFAULT_OPSET, dynamic_batch: bool = True,
                images: list[Path] | None = None, path: Path | None = None) -> ExportResult:
    """Export, check parity on real images, then write model.onnx + model.onnx.json atomically."""
    onnx = _import_onnx()
    check_opset(opset)
    started = time.perf_counter()
    proto = trace_to_onnx(source.model, source.spec.input_shape, opset, dynamic_batch)
    _stamp(proto, source)
    try:
        onnx.checker.check_model(proto)
    except Exception as exc:
        raise UserError(f"the exported graph fails onnx.checker ({str(exc).splitlines()[0]})"[:400]) from None
    data = proto.SerializeToString()
    parity = check_parity(source, data, images, dynamic_batch)
    if not parity.ok:
        raise UserError(f"export parity failed, nothing written: {parity.describe()}")
    path = Path(path) if path else source.onnx_file
    atomic_write_bytes(path, data)
    metadata = sidecar_metadata(source, path, data, opset, dynamic_batch, parity)
    sidecar = sidecar_path(path)
    atomic_write_json(sidecar, metadata)
    return ExportResult(path, sidecar, parity, opset, dynamic_batch, len(data), time.perf_counter() - started, metadata)


def check_parity(source: ModelSource, model: bytes | Path, images: list[Path] | None,
                 dynamic_batch: bool = True) -> Parity:
    inputs, real = parity_inputs(source, images)
    reference = torch_logits(source.model, inputs)
    candidate = onnx_logits(model, inputs, batch=16 if dynamic_batch else 1)
    return compare_logits(reference, candidate, real)


def sidecar_path(onnx_path: Path) -> Path:
    return Path(onnx_path).with_name(Path(onnx_path).name + ".json")


def sidecar_metadata(source: ModelSource, path: Path, data: bytes, opset: int, dynamic_batch: bool,
                     parity: Parity) -> dict[str, Any]:
    spec = source.spec
    batch: str | int = "batch" if dynamic_batch else 1
    return {
        "format": "onnx",
        "file": path.name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
        "opset": opset,
        "dynamic_batch": dynamic_batch,
        "input": {"name": INPUT_NAME, "shape": [batch, *spec.input_shape], "dtype": "float32", "layout": "NCHW"},
        "output": {"name": OUTPUT_NAME, "shape": [batch, spec.num_classes], "dtype": "float32"},
        "preprocessing": {
            "channels": spec.channels, "resize_shorter_side": spec.resize_size, "center_crop": spec.crop_size,
            "interpolation": spec.interpolation, "scale": "pixel / 255", "mean": spec.mean, "std": spec.std,
        },
        "classes": spec.labels,
        "spec": spec.to_dict(),
        "source": {"label": source.label, "weights": source.weights, "weights_sha256": source.weights_sha256},
        "parity": parity.to_dict(),
        "versions": package_versions(),
        "exported": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


# --------------------------------------------------------------------------------------- reading


def read_sidecar(onnx_path: Path) -> dict[str, Any] | None:
    path = sidecar_path(onnx_path)
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _dims(value_info: Any) -> list[int | str]:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
            for d in value_info.type.tensor_type.shape.dim]


def check_onnx_file(path: Path, spec: ModelSpec) -> None:
    """A usable ONNX classifier for this spec, or a one-line error: missing, not ONNX, truncated,
    or a graph whose input/output shapes belong to another architecture or class count."""
    onnx = _import_onnx()
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: ONNX file not found; run `inceptionlab export` first")
    try:
        proto = onnx.load(str(path), load_external_data=False)
        onnx.checker.check_model(proto)
    except Exception as exc:
        raise UserError(f"{path}: not a readable ONNX model, or truncated ({type(exc).__name__}); "
                        "re-run `inceptionlab export`") from None
    graph = proto.graph
    if len(graph.input) != 1 or len(graph.output) != 1:
        raise UserError(f"{path}: expected one input and one output, found {len(graph.input)} and "
                        f"{len(graph.output)}; export it with `inceptionlab export`")
    inputs, outputs = _dims(graph.input[0]), _dims(graph.output[0])
    want_in = list(spec.input_shape)
    if inputs[1:] != want_in or outputs[1:] != [spec.num_classes]:
        raise UserError(f"{path}: graph takes {inputs} -> {outputs} but the model ({spec.arch}) takes "
                        f"[batch, {', '.join(map(str, want_in))}] -> [batch, {spec.num_classes}]: it is from "
                        "another model; re-run `inceptionlab export`")


def current_export(source: ModelSource, path: Path | None = None, dynamic_batch: bool = False) -> Path | None:
    """The existing export when it is valid, was made from exactly these weights (and has a dynamic
    batch axis, when asked), else None."""
    path = Path(path) if path else source.onnx_file
    meta = read_sidecar(path)
    if not path.is_file() or meta is None:
        return None
    if meta.get("source", {}).get("weights_sha256") != source.weights_sha256:
        return None
    if dynamic_batch and not meta.get("dynamic_batch"):
        return None
    check_onnx_file(path, source.spec)
    if hashlib.sha256(path.read_bytes()).hexdigest() != meta.get("sha256"):
        return None  # edited or replaced since the export: export again
    return path


def ensure_export(source: ModelSource, images: list[Path] | None = None, log: Any = None) -> Path:
    """The source's ONNX file with a dynamic batch axis (one file for every batch size), exported
    with the parity check unless a current one exists."""
    found = current_export(source, dynamic_batch=True)
    if found is not None:
        return found
    if log:
        log(f"exporting {source.label} to {source.onnx_file} (no current dynamic-batch export of these weights)")
    result = export_onnx(source, images=images)
    if log:
        log(result.parity.describe())
    return result.path


def quiet_stdout() -> contextlib.AbstractContextManager[Any]:
    """Libraries that print progress (nncf, the exporter) must not mix with --json on stdout."""
    return contextlib.redirect_stdout(sys.stderr if sys.stderr else io.StringIO())
