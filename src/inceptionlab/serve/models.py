"""A served model: loaded from a run directory or a pretrained name, on one runtime, warmed up.

Image models run on infer/runtimes.py's sessions (the same ones `bench` times) and are fed what
`predict` feeds them: `decode_rgb` (data/images.py, JPEGs drafted down to the eval resize), the
spec's eval transform and its normaliser (data/transforms.py). Text models (input_kind "tokens")
take raw strings through the run's own tokenizer, like `predict --text` (infer/text.py).

Batches are padded up to the next bucket (1, 2, 4, ..., max_batch), so a model only ever runs the
bucket sizes, and every one of them is run once at start-up: the first call at a new shape costs
oneDNN kernel creation (and on OpenVINO a static-shape compile), never a client's request.

`auto` backend on a CPU: OpenVINO when installed, else ONNX Runtime, else eager PyTorch. Measured
on this project's 2-core AMD EPYC, Inception v3 299 px batch 8 (see the README's bench table):
OpenVINO bf16 was the fastest CPU runtime, then OpenVINO/ONNX Runtime fp32, then eager. On a GPU,
auto is eager PyTorch (no compile wait at start-up; `--backend compile|onnxruntime` when it pays).
Reduced precisions are used only when they pass the agreement rule (infer/quantize.py: >= 99%
top-1 agreement with fp32 on >= 200 held-out real images): `auto` then falls back to fp32, an
explicit `--precision int8` that fails is an error.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from PIL import Image

from inceptionlab.checkpoint import RunDir
from inceptionlab.data.io.decode import decode_rgb
from inceptionlab.data.text.vectorizer import TextVectorizer
from inceptionlab.engine.task import make_task
from inceptionlab.infer.batching import batch_buckets
from inceptionlab.errors import UserError
from inceptionlab.infer.inputs import image_files
from inceptionlab.infer.parity import torch_logits
from inceptionlab.infer.quantize import image_sets, judge
from inceptionlab.infer.runtimes import (
    NATIVE_LAYOUT,
    PRECISIONS,
    REDUCED_PRECISIONS,
    Artifacts,
    RuntimeSession,
    Target,
    TorchSession,
    Unsupported,
    get_runtime,
)
from inceptionlab.infer.source import load_source
from inceptionlab.models.registry import load_run_model
from inceptionlab.models.spec import ModelSpec
from inceptionlab.serve.protocol import InputTensor, ProtocolError

BACKENDS = ("auto", "openvino", "onnxruntime", "compile", "eager")
# An image model declares two inputs, and a request gives exactly one of them: `images`, the
# tensor the exported ONNX model and its Triton repository take (FP32 normalised, or UINT8 pixels
# resized and cropped), and `image_bytes`, encoded files (JPEG, PNG, ...) that the server decodes
# and preprocesses. Encoded files are BYTES with dims [1] per batch item, shape [-1, 1]: Triton's
# convention for an encoded-image input of a batching model, which perf_analyzer and Triton's
# clients read from the metadata. Requests may send BYTES as [N] or [N, 1]; `images` also takes
# BYTES (encoded files) for clients written before `image_bytes` was declared.
IMAGE_INPUT = "images"
ENCODED_INPUT = "image_bytes"
TEXT_INPUT = "text"
OUTPUTS = ("probabilities", "logits")
# Uploads above this many pixels are refused before decoding: a 40 Mpx RGB image is 120 MB decoded,
# 12x a 12 Mpx phone photo; JPEGs are drafted down anyway, PNG/TIFF "bombs" would be decoded in full.
MAX_UPLOAD_PIXELS = 40_000_000
MAX_TEXT_BYTES = 100_000  # a long IMDB review is ~10 kB; the model reads its first seq_len words


@dataclass
class ModelLoadSettings:
    """How each served model is loaded: runtime, precision, device, batch buckets, instances."""

    backend: str = "auto"
    precision: str = "auto"
    device: str = "cpu"
    max_batch: int | None = None  # None: measured at start-up (choose_max_batch)
    instances: int = 1
    weights: str | None = None  # --model: imagenet (default), random, or a state_dict file
    exports: Path = Path("runs/exports")  # --model: where exports and caches go
    log: Callable[[str], None] = print


# --max-batch auto: the buckets up to AUTO_MAX_BATCH are warmed up, then kept only if the largest runs
# at least BATCHING_PAYS times the images/s of batch 1. Below that a batch mostly adds waiting: on the
# 2-core AMD EPYC, OpenVINO bf16 Inception v3 ran batch 8 at 1.11x batch 1's images/s, and the highest
# Poisson rate that held the p99 SLO was 21.6/s unbatched against 11-15/s with batches of 8.
AUTO_MAX_BATCH = 32
BATCHING_PAYS = 1.25


def auto_backend(device: str, input_kind: str) -> str:
    if input_kind != "image" or device != "cpu":
        return "eager"
    for name in ("openvino", "onnxruntime"):
        if get_runtime(name).missing() is None:
            return name
    return "eager"


@dataclass
class Engine:
    """One instance of a model: sessions by bucket (one shared session for dynamic-shape runtimes)."""

    sessions: dict[int, RuntimeSession]
    buckets: list[int]

    def bucket(self, count: int) -> int:
        return next(b for b in self.buckets if b >= count)

    def run(self, inputs: np.ndarray) -> np.ndarray:
        count = len(inputs)
        size = self.bucket(count)
        if size > count:  # pad with copies of the last row: real values, no NaN surprises
            inputs = np.concatenate([inputs, np.repeat(inputs[-1:], size - count, 0)])
        session = self.sessions[size]
        return session.to_numpy(session.run(session.place(np.ascontiguousarray(inputs))))[:count]


@dataclass
class ServedModel:
    name: str
    spec: ModelSpec
    source_label: str
    backend: str
    precision: str
    provider: str
    engines: list[Engine]
    max_batch: int
    vectorizer: Any = None  # text models: the run's TextVectorizer
    agreement: str | None = None  # the verdict that allowed a reduced precision
    warmup_s: float = 0.0
    batching: str | None = None  # how --max-batch auto decided
    task: Any = field(init=False)

    def __post_init__(self) -> None:
        self.task = make_task(self.spec.task, self.spec.num_classes)
        if self.is_image:
            self.transform = self.spec.eval_transform()
            self.normalize = self.spec.normalizer()

    @property
    def is_image(self) -> bool:
        return self.spec.input_kind == "image"

    @property
    def input_shape(self) -> list[int]:
        if self.is_image:
            return [self.spec.channels, self.spec.crop_size, self.spec.crop_size]
        return [self.vectorizer.seq_len]

    @property
    def buckets(self) -> list[int]:
        return self.engines[0].buckets

    def describe(self) -> str:
        extra = "".join(f"; {note}" for note in (self.agreement, self.batching) if note)
        return (f"{self.name}: {self.spec.arch} ({self.spec.input_kind}, {self.spec.num_classes} classes) from "
                f"{self.source_label} on {self.provider} [{self.backend} {self.precision}], batches "
                f"{','.join(map(str, self.buckets))} x {len(self.engines)} instance(s), warmed in "
                f"{self.warmup_s:.1f} s{extra}")

    # ------------------------------------------------------------------ metadata (OIP)

    def declared_inputs(self) -> list[dict[str, Any]]:
        """The inputs as clients discover them (metadata and config): the batch axis first, -1."""
        if self.is_image:
            return [{"name": IMAGE_INPUT, "datatype": "FP32", "shape": [-1, *self.input_shape]},
                    {"name": ENCODED_INPUT, "datatype": "BYTES", "shape": [-1, 1]}]
        return [{"name": TEXT_INPUT, "datatype": "BYTES", "shape": [-1, 1]}]

    def metadata(self) -> dict[str, Any]:
        # logits: one column per class, or one for a binary text model (sigmoid gives P(class 1))
        outputs = [{"name": "probabilities", "datatype": "FP32", "shape": [-1, self.spec.num_classes]},
                   {"name": "logits", "datatype": "FP32", "shape": [-1, -1]}]
        return {"name": self.name, "versions": ["1"], "platform": f"inceptionlab_{self.backend}",
                "inputs": self.declared_inputs(), "outputs": outputs}

    def accepted_inputs(self) -> str:
        if self.is_image:
            shape = "x".join(map(str, ["N", *self.input_shape]))
            return (f'one of "{IMAGE_INPUT}": FP32 {shape} (normalised) or UINT8 {shape} (resized and cropped, '
                    f'0-255), or "{ENCODED_INPUT}": BYTES [N] or [N, 1] (encoded image files)')
        return f'"{TEXT_INPUT}": BYTES [N] or [N, 1] (UTF-8 texts)'

    # ------------------------------------------------------------------ inputs (worker threads)

    def prepare_tensor(self, tensor: InputTensor) -> tuple[np.ndarray, int]:
        """An OIP input tensor -> what `run` takes (float32/uint8 NCHW, or int64 token ids)."""
        readers = {IMAGE_INPUT: self._image_tensor, ENCODED_INPUT: self._encoded_images} if self.is_image \
            else {TEXT_INPUT: self._texts}
        if tensor.name not in readers:
            raise ProtocolError(f"model {self.name!r} has no input {tensor.name!r}; it takes {self.accepted_inputs()}")
        return readers[tensor.name](tensor)

    def _image_tensor(self, tensor: InputTensor) -> tuple[np.ndarray, int]:
        if tensor.datatype == "BYTES":  # encoded files sent to `images`, as before `image_bytes` was declared
            return self._encoded_images(tensor)
        if tensor.datatype not in ("FP32", "UINT8") or list(tensor.shape[1:]) != self.input_shape \
                or len(tensor.shape) != 4 or tensor.shape[0] < 1:
            raise ProtocolError(f"model {self.name!r}: got {tensor.datatype} {tensor.shape}; it takes "
                                f"{self.accepted_inputs()}")
        return np.asarray(tensor.data), tensor.shape[0]

    def _encoded_images(self, tensor: InputTensor) -> tuple[np.ndarray, int]:
        return self.decode_images(_bytes_batch(tensor))

    def _texts(self, tensor: InputTensor) -> tuple[np.ndarray, int]:
        return self.encode_texts([_utf8(item, i) for i, item in enumerate(_bytes_batch(tensor))])

    def decode_images(self, blobs: Sequence[bytes], names: Sequence[str] | None = None) -> tuple[np.ndarray, int]:
        if not blobs:
            raise ProtocolError("no images in the request")
        names = names or [f"#{i}" for i in range(len(blobs))]
        return np.stack([self.preprocess_image(blob, name) for blob, name in zip(blobs, names)]), len(blobs)

    def preprocess_image(self, data: bytes, name: str) -> np.ndarray:
        """Encoded image -> uint8 CHW after the spec's eval transform (what `predict` does to a file)."""
        if not data:
            raise ProtocolError(f"image {name}: empty; send the image file's bytes")
        _check_pixels(data, name)
        image = decode_rgb(data, name, max_side=self.spec.resize_size)
        return np.asarray(torch.as_tensor(self.transform(image)))  # the spec's transform converts channels too

    def encode_texts(self, texts: Sequence[str]) -> tuple[np.ndarray, int]:
        if not texts:
            raise ProtocolError("no texts in the request")
        return self.vectorizer.encode(list(texts)).numpy(), len(texts)

    # ------------------------------------------------------------------ inference (batcher threads)

    def run(self, instance: int, items: Sequence[np.ndarray]) -> list[dict[str, np.ndarray]]:
        """One batch of requests -> per request {"logits", "probabilities"}."""
        batch = np.concatenate([self._model_input(item) for item in items])
        logits = self.engines[instance].run(batch)
        probs = self.task.probabilities(torch.from_numpy(logits)).numpy()
        out, start = [], 0
        for item in items:
            end = start + len(item)
            out.append({"probabilities": probs[start:end], "logits": self._class_logits(logits[start:end])})
            start = end
        return out

    def _model_input(self, item: np.ndarray) -> np.ndarray:
        if item.dtype == np.uint8:  # resized + cropped pixels: the spec's normaliser, as predict does
            # Request tensors are read-only views of the body (np.frombuffer): copy only those.
            return self.normalize(torch.from_numpy(np.require(item, requirements="W"))).numpy()
        return item

    def _class_logits(self, logits: np.ndarray) -> np.ndarray:
        return logits.reshape(len(logits), -1).astype(np.float32, copy=False)

    def topk(self, probs: np.ndarray, k: int) -> list[dict[str, Any]]:
        """Like `predict --json`: [{"label", "index", "prob"}], most probable first."""
        order = np.argsort(-probs)[: min(k, len(probs))]
        return [{"label": self.spec.labels[i], "index": int(i), "prob": round(float(probs[i]), 6)} for i in order]


def _bytes_batch(tensor: InputTensor) -> list[bytes]:
    """BYTES [N] or [N, 1] (one element per batch item) -> the N elements."""
    if tensor.datatype != "BYTES" or len(tensor.shape) not in (1, 2) or tensor.shape[1:] not in ([], [1]):
        raise ProtocolError(f"input {tensor.name!r}: takes BYTES of shape [N] or [N, 1], got {tensor.datatype} "
                            f"{tensor.shape}")
    return list(tensor.data)


def _utf8(item: bytes, index: int) -> str:
    if len(item) > MAX_TEXT_BYTES:
        raise ProtocolError(f"text #{index} has {len(item)} bytes (limit {MAX_TEXT_BYTES}); shorten it")
    try:
        return item.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"text #{index} is not valid UTF-8") from None


def _check_pixels(data: bytes, name: str) -> None:
    """Refuse decompression bombs from the header alone (Image.open is lazy: nothing is decoded)."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except Exception:  # noqa: BLE001 - not an image, or PIL's own bomb check: decode_rgb says which
        return
    if width * height > MAX_UPLOAD_PIXELS:
        raise ProtocolError(f"image {name}: {width} x {height} pixels is above the {MAX_UPLOAD_PIXELS:,} pixel "
                            "limit; downscale it first")


# --------------------------------------------------------------------------------------- loading


def load_served_model(settings: ModelLoadSettings, run_dir: Path | None = None, model: str | None = None,
                      name: str | None = None) -> ServedModel:
    """A run directory or a pretrained name, on the chosen runtime, warmed up at every bucket."""
    if run_dir is not None and _input_kind(run_dir) == "tokens":
        served = _load_text_model(settings, run_dir, name)
    else:
        served = _load_image_model(settings, run_dir, model, name)
    started = time.perf_counter()
    warm_up(served)
    if settings.max_batch is None:
        served.batching = choose_max_batch(served)
    served.warmup_s = time.perf_counter() - started
    return served


def choose_max_batch(served: ServedModel, clock: Callable[[], float] = time.perf_counter, repeats: int = 3) -> str:
    """Keep the warmed buckets if the largest pays (BATCHING_PAYS), else serve unbatched; says why."""
    engine, largest = served.engines[0], served.buckets[-1]
    if largest == 1:
        return "batch 1 only"
    seconds = {size: _best_time(engine, served, size, clock, repeats) for size in (1, largest)}
    gain = seconds[1] * largest / seconds[largest]
    if gain >= BATCHING_PAYS:
        return f"--max-batch auto: batch {largest} runs {gain:.2f}x the images/s of batch 1, batching on"
    for index, kept in enumerate(served.engines):  # the other compiled buckets are freed with their sessions
        served.engines[index] = Engine({1: kept.sessions[1]}, [1])
    served.max_batch = 1
    return (f"--max-batch auto: batch {largest} runs only {gain:.2f}x the images/s of batch 1 here "
            f"(< {BATCHING_PAYS}), serving unbatched; --max-batch N forces batching")


def _best_time(engine: Engine, served: ServedModel, size: int, clock: Callable[[], float], repeats: int) -> float:
    inputs = blank_batch(served, size)
    times = []
    for _ in range(repeats):
        start = clock()
        engine.run(inputs)
        times.append(clock() - start)
    return min(times)  # the least disturbed run: others are the machine's noise, not the model's


def _input_kind(run_dir: Path) -> str:
    return ModelSpec.load(RunDir.open(run_dir).spec_file).input_kind


def _load_text_model(settings: ModelLoadSettings, run_dir: Path, name: str | None) -> ServedModel:
    if settings.backend not in ("auto", "eager"):
        raise UserError(f"{run_dir}: text models run on --backend eager (the ONNX export covers image models)")
    if settings.precision not in ("auto", "fp32"):
        raise UserError(f"{run_dir}: text models run in fp32 (an embedding + LSTM-sized model gains nothing)")
    net, spec = load_run_model(run_dir)
    vectorizer = TextVectorizer.load(Path(run_dir) / spec.tokenizer)
    buckets = batch_buckets(settings.max_batch or AUTO_MAX_BATCH)
    engines = []
    for _ in range(settings.instances):
        session = TorchSession(net, "fp32", "nchw", settings.device, buckets[-1])
        engines.append(Engine({b: session for b in buckets}, buckets))
    return ServedModel(name or spec.arch, spec, str(run_dir), "eager", "fp32", engines[0].sessions[1].provider,
                       engines, buckets[-1], vectorizer)


def _load_image_model(settings: ModelLoadSettings, run_dir: Path | None, model: str | None,
                      name: str | None) -> ServedModel:
    source = load_source(run_dir=run_dir, model=model, weights=settings.weights, out=settings.exports)
    backend = auto_backend(settings.device, "image") if settings.backend == "auto" else settings.backend
    runtime = get_runtime(backend)
    runtime.require()
    artifacts = Artifacts(source, log=settings.log)
    target = Target(device=settings.device)
    layout = "nchw" if runtime.layouts != (NATIVE_LAYOUT,) else NATIVE_LAYOUT
    for precision in _precision_candidates(settings.precision, backend):
        try:
            engine, verdict = _open_engine(runtime, artifacts, precision, layout, target, settings)
        except Unsupported as exc:
            settings.log(f"{source.label}: {backend} {precision} skipped: {exc}")
            continue
        if verdict is not None and not verdict.usable:
            if settings.precision == "auto":
                settings.log(f"{source.label}: {backend} {precision} not used: {verdict.reason}")
                continue
            if precision == "int8":
                raise UserError(f"{source.label}: int8 failed the agreement rule ({verdict.reason}); serve fp32 "
                                "or pass --calib-images with more real images")
            settings.log(f"warning: {source.label}: {precision} as asked, but {verdict.reason}")
        engines = [engine] + [_open_engine(runtime, artifacts, precision, layout, target, settings, check=False)[0]
                              for _ in range(settings.instances - 1)]
        provider = next(iter(engine.sessions.values())).provider
        return ServedModel(name or source.spec.arch, source.spec, source.label, backend, precision, provider, engines,
                           engine.buckets[-1], agreement=verdict.reason if verdict else None)
    raise UserError(f"{source.label}: no usable precision on {backend} (see the lines above)")


def _precision_candidates(requested: str, backend: str) -> list[str]:
    if requested == "auto":
        # OpenVINO bf16: the fastest CPU configuration measured; the rule decides if it may be used.
        return ["bf16", "fp32"] if backend == "openvino" else ["fp32"]
    if requested not in PRECISIONS:
        raise UserError(f"--precision {requested!r}: use auto or one of {', '.join(PRECISIONS)}")
    return [requested]


def _open_engine(runtime: Any, artifacts: Artifacts, precision: str, layout: str, target: Target,
                 settings: ModelLoadSettings, check: bool = True) -> tuple[Engine, Any]:
    buckets = batch_buckets(settings.max_batch or AUTO_MAX_BATCH)
    if precision == "int8" and artifacts.sets is None:
        artifacts.sets = _image_sets(artifacts)  # calibration images, before the quantizer asks
    if runtime.name == "openvino":  # static shapes: one compiled model per bucket
        sessions = {b: runtime.open(artifacts, precision, layout, target, b) for b in buckets}
    else:  # dynamic shapes: one session runs every bucket
        shared = runtime.open(artifacts, precision, layout, target, buckets[-1])
        sessions = {b: shared for b in buckets}
    engine = Engine(sessions, buckets)
    verdict = _agreement(artifacts, engine, settings) if check and precision in REDUCED_PRECISIONS else None
    return engine, verdict


def _agreement(artifacts: Artifacts, engine: Engine, settings: ModelLoadSettings) -> Any:
    """infer/quantize.py's rule, as `bench` applies it: top-1 agreement with fp32 PyTorch."""
    if artifacts.sets is None:
        artifacts.sets = _image_sets(artifacts)
    inputs = artifacts.sets.holdout_inputs()
    if len(inputs) == 0:
        return judge(np.zeros((0, 1)), np.zeros((0, 1)))
    candidate = np.concatenate([engine.run(inputs[i:i + engine.buckets[-1]])
                                for i in range(0, len(inputs), engine.buckets[-1])])
    return judge(torch_logits(artifacts.source.model, inputs), candidate)


def _image_sets(artifacts: Artifacts) -> Any:
    """The guide's sample pictures and the run's val images, split into calibration and held-out."""
    sets = image_sets(image_files(None, artifacts.source), artifacts.source.spec)
    artifacts.log(f"agreement images: {sets.describe()}")
    return sets


def blank_batch(served: ServedModel, size: int) -> np.ndarray:
    """Zeros of the model's input shape and dtype: images as floats, texts as token ids."""
    return np.zeros((size, *served.input_shape), np.float32 if served.is_image else np.int64)


def warm_up(served: ServedModel) -> None:
    """Run every bucket of every instance once (twice for the largest) before reporting ready."""
    for engine in served.engines:
        for size in engine.buckets:
            engine.run(blank_batch(served, size))
        engine.run(blank_batch(served, engine.buckets[-1]))
