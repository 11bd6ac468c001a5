"""A served model: loaded from a run directory or a pretrained name, on one runtime, warmed up.

Image models run on infer/runtimes.py's sessions (the same ones `bench` times) and are fed what
`predict` feeds them: `decode_rgb` (data/images.py, JPEGs drafted down to the eval resize), the
spec's eval transform and its normaliser (data/transforms.py). Text models (input_kind "tokens")
take raw strings through the run's own tokenizer, like `predict --text` (infer/text.py).

Batches are padded up to the next bucket (1, 2, 4, ..., max_batch), so a model only ever runs the
bucket sizes, and every one of them is run once at start-up: the first call at a new shape costs
oneDNN kernel creation (and on OpenVINO a static-shape compile), never a client's request. A request
larger than the plan's batch (allowed up to `max_request`) runs as consecutive batches of the largest.

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
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from PIL import Image

from inceptionlab import hardware
from inceptionlab.checkpoint import RunDir
from inceptionlab.data.io.decode import decode_rgb, open_image
from inceptionlab.data.io.image_files import sample_image_files
from inceptionlab.data.text.vectorizer import TextVectorizer
from inceptionlab.infer.batching import batch_buckets
from inceptionlab.errors import UserError
from inceptionlab.infer.tta import run_with_tta
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
    auto_backend,
    get_runtime,
)
from inceptionlab.infer.source import load_source
from inceptionlab.infer.speed import decide_inference
from inceptionlab.infer.triton import model_name
from inceptionlab.models.registry import load_run_model
from inceptionlab.models.penultimate import WithFeatures, head_name
from inceptionlab.models.rule import DecisionRule
from inceptionlab.models.spec import ModelSpec
from inceptionlab.queueing import BatchRule
from inceptionlab.serve.batcher import consecutive_batches
from inceptionlab.serve.protocol import (
    InputTensor,
    ProtocolError,
    encode_bytes_elements,
    encode_infer_response,
    parse_infer_request,
)

BACKENDS = ("auto", "openvino", "onnxruntime", "compile", "eager")
# The backends that run the PyTorch model itself, so its penultimate features can come out beside the
# logits (a rule with a kNN bank needs them); the others run an exported graph of logits.
FEATURE_BACKENDS = ("eager", "compile")
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
# A model whose decision rule rejects (a reject threshold: models/rule.py) also answers `unknown`: BOOL
# [N, 1], true where the rule answers "unknown". `probabilities` are the rule's calibrated ones (softmax of
# logits / its temperature); `logits` are the model's own (averaged over the rule's TTA views, if any).
UNKNOWN_OUTPUT = "unknown"
# A rule with a kNN bank also answers each input's distance to its k-th nearest training feature: FP32
# [N, 1]; above the rule's `knn_threshold` (its parameters) the answer is unknown, far from the training data.
KNN_OUTPUT = "knn_distance"
# Uploads above this many pixels are refused before decoding: a 40 Mpx RGB image is 120 MB decoded,
# 12x a 12 Mpx phone photo; JPEGs are drafted down anyway, PNG/TIFF "bombs" would be decoded in full.
MAX_UPLOAD_PIXELS = 40_000_000
# All of one request's images together, as decoded (JPEGs after drafting): 80 Mpx is 240 MB of RGB, two
# of the largest uploads; 32 phone photos of 12 Mpx draft down to ~6 Mpx at a 342 px eval size. Checked
# from the headers before anything is decoded, so one request cannot make the server decode dozens of
# large PNGs in full.
MAX_REQUEST_PIXELS = 80_000_000
MAX_TEXT_BYTES = 100_000  # a long IMDB review is ~10 kB; the model reads its first seq_len words


@dataclass
class ModelLoadSettings:
    """How each served model is loaded: runtime, precision, device, batch buckets, instances.

    None for max_batch, instances or max_delay_ms means `auto`: decided on this machine at start-up
    (hardware.decide_serving: each plan's saturation images/s measured and cached per machine, and the
    plan holding the highest Poisson rate within `slo_ms` at p99 chosen).
    """

    backend: str = "auto"
    precision: str = "auto"
    device: str = "cpu"
    max_batch: int | None = None
    instances: int | None = None
    weights: str | None = None  # --model: imagenet (default), random, or a state_dict file
    exports: Path = Path("runs/exports")  # --model: where exports and caches go
    log: Callable[[str], None] = print
    max_delay_ms: float | None = None
    fresh: bool = False  # measure the serving plan afresh instead of reusing the speed cache
    slo_ms: float = hardware.DEFAULT_SLO_MS  # the p99 objective the plan is chosen for
    tta: str | None = None  # test-time augmentation (models/tta.py); None: the model spec's own


@dataclass
class Engine:
    """One instance of a model: sessions by bucket (one shared session for dynamic-shape runtimes)."""

    sessions: dict[int, RuntimeSession]
    buckets: list[int]

    def bucket(self, count: int) -> int:
        return next(b for b in self.buckets if b >= count)

    def run(self, inputs: np.ndarray) -> np.ndarray:
        count = len(inputs)
        if count > self.buckets[-1]:  # a request larger than the plan's batch: consecutive full batches
            return np.concatenate([self.run(inputs[start:stop])
                                   for start, stop in consecutive_batches(count, self.buckets[-1])])
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
    max_batch: int  # the most items one batch holds (the serving plan's)
    vectorizer: Any = None  # text models: the run's TextVectorizer
    agreement: str | None = None  # the verdict that allowed a reduced precision
    warmup_s: float = 0.0
    batching: str | None = None  # the serving plan and the evidence it was chosen on
    max_delay_ms: float = 2.0  # how long the batcher waits for a batch to fill
    rule: DecisionRule | None = None  # the decision rule it answers by (its TTA runs around the engine); None: the spec's
    # The most items one request may hold: --max-batch when set, else AUTO_MAX_BATCH whatever the plan
    # chose, so what a client may send never depends on a timing (a larger request runs as consecutive
    # batches). None: max_batch.
    max_request: int | None = None
    auto_limit: bool = False  # max_request is --max-batch auto's, not a --max-batch the user set
    batch_rule: BatchRule | None = None  # when a batch goes (queueing.py); None: wait max_delay_ms for a full one
    # Columns of penultimate features after the logits in the engine's output (models/penultimate.py
    # WithFeatures), for a rule with a kNN bank; 0: the engine outputs logits alone.
    feature_dim: int = 0

    def __post_init__(self) -> None:
        self.max_request = max(self.max_request or 0, self.max_batch)
        self.rule = self.rule or self.spec.rule
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
    def tta(self) -> str:
        """Test-time augmentation around the engine: the rule's."""
        return self.rule.tta

    @property
    def buckets(self) -> list[int]:
        return self.engines[0].buckets

    @property
    def outputs(self) -> tuple[str, ...]:
        """The outputs a request may ask for (all of them when it names none)."""
        return OUTPUTS + ((UNKNOWN_OUTPUT,) if self.rule.rejects else ()) + ((KNN_OUTPUT,) if self.rule.knn else ())

    def describe(self) -> str:
        rule = self.rule.describe() if self.rule.fitted or self.tta != "none" else None
        extra = "".join(f"; {note}" for note in (self.agreement, self.batching, rule) if note)
        averaged = ", EMA weights" if self.spec.weights == "ema" else ""  # spec.json: which weights model.pt holds
        return (f"{self.name}: {self.spec.arch} ({self.spec.input_kind}, {self.spec.num_classes} classes{averaged}) from "
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
        if UNKNOWN_OUTPUT in self.outputs:
            outputs.append({"name": UNKNOWN_OUTPUT, "datatype": "BOOL", "shape": [-1, 1]})
        if KNN_OUTPUT in self.outputs:
            outputs.append({"name": KNN_OUTPUT, "datatype": "FP32", "shape": [-1, 1]})
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

    def takes_as_is(self, tensor: InputTensor) -> bool:
        """A tensor that `prepare_tensor` only checks (pixels or normalised values): no decoding."""
        return self.is_image and tensor.name == IMAGE_INPUT and tensor.datatype in ("FP32", "UINT8")

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
        self.check_pixel_budget(blobs)
        names = names or [f"#{i}" for i in range(len(blobs))]
        return np.stack([self.preprocess_image(blob, name) for blob, name in zip(blobs, names)]), len(blobs)

    def check_pixel_budget(self, blobs: Sequence[bytes]) -> None:
        """Refuse a request whose images would decode to more than MAX_REQUEST_PIXELS together, from
        their headers alone (unreadable headers count 0: decoding them fails on its own). One image
        cannot exceed it: each is held to MAX_UPLOAD_PIXELS, which is less."""
        if len(blobs) < 2:
            return  # a header read took ~0.2 ms, a 500x375 JPEG's decode ~2.4 ms (2-core AMD EPYC, busy)
        total = sum(_decoded_pixels(blob, self.spec.resize_size) for blob in blobs)
        if total > MAX_REQUEST_PIXELS:
            raise ProtocolError(f"the request's {len(blobs)} images decode to {total:,} pixels, above the "
                                f"{MAX_REQUEST_PIXELS:,}-pixel budget of one request; send fewer or smaller images")

    def preprocess_image(self, data: bytes, name: str) -> np.ndarray:
        """Encoded image -> uint8 CHW after the spec's eval transform (what `predict` does to a file)."""
        return preprocess_upload(data, name, self.spec.resize_size, self.transform)

    def encode_texts(self, texts: Sequence[str]) -> tuple[np.ndarray, int]:
        if not texts:
            raise ProtocolError("no texts in the request")
        return self.vectorizer.encode(list(texts)).numpy(), len(texts)

    # ------------------------------------------------------------------ inference (batcher threads)

    def run(self, instance: int, items: Sequence[np.ndarray]) -> list[dict[str, Any]]:
        """One batch of requests -> per request {"logits", "probabilities"} (+ "unknown" when the rule rejects),
        the outputs a request may name, and "answers": the rule's answer per item, as /v1/classify gives it."""
        output = self._logits(self.engines[instance], self._batch_input(items))
        logits, features = WithFeatures.split(output, self.feature_dim) if self.feature_dim else (output, None)
        answers = self.rule.decide(logits, features)
        probs = answers.probabilities.astype(np.float32)
        unknown = answers.unknown.reshape(-1, 1)
        out, start = [], 0
        for item in items:
            end = start + len(item)
            answer = {"probabilities": probs[start:end], "logits": self._class_logits(logits[start:end]),
                      "answers": [answers.row(i, self.spec.labels) for i in range(start, end)]}
            if UNKNOWN_OUTPUT in self.outputs:
                answer[UNKNOWN_OUTPUT] = unknown[start:end]
            if answers.distance is not None:
                answer[KNN_OUTPUT] = answers.distance[start:end].astype(np.float32).reshape(-1, 1)
            out.append(answer)
            start = end
        return out

    def _logits(self, engine: Engine, batch: np.ndarray) -> np.ndarray:
        """The engine's logits, averaged over the TTA views of the batch when the model has them."""
        if self.tta == "none":
            return engine.run(batch)
        merged = run_with_tta(lambda view: torch.from_numpy(engine.run(view.numpy())), torch.from_numpy(batch), self.tta)
        return merged.numpy()

    def _batch_input(self, items: Sequence[np.ndarray]) -> np.ndarray:
        """The requests' items as one model input: pixels of every request normalised in one call."""
        if len(items) > 1 and all(item.dtype == np.uint8 for item in items):
            return self._model_input(np.concatenate(items))
        return np.concatenate([self._model_input(item) for item in items])

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


def preprocess_upload(data: bytes, name: str, resize_size: int, transform: Callable[[Any], Any]) -> np.ndarray:
    """An uploaded file's bytes -> uint8 CHW after the spec's eval `transform` (what `predict` does to a file)."""
    if not data:
        raise ProtocolError(f"image {name}: empty; send the image file's bytes")
    # Decompression bombs are refused from the header, before anything is decoded.
    image = decode_rgb(data, name, max_side=resize_size, max_pixels=MAX_UPLOAD_PIXELS)
    return np.asarray(torch.as_tensor(transform(image)))  # the spec's transform converts channels too


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


def _decoded_pixels(data: bytes, max_side: int) -> int:
    """How many pixels decoding `data` produces (decode_rgb drafts JPEGs down to `max_side`), read from
    the header (Image.open is lazy; draft only picks the JPEG decoder's scale); 0 when PIL cannot tell."""
    try:
        with open_image(io.BytesIO(data), Path("upload")) as image:  # HEIC too, as decode_rgb opens it
            image.draft("RGB", (max_side, max_side))
            width, height = image.size
    except Exception:  # noqa: BLE001 - not an image: decode_rgb says so, per file
        return 0
    return width * height


# --------------------------------------------------------------------------------------- loading


def load_served_model(settings: ModelLoadSettings, run_dir: Path | None = None, model: str | None = None,
                      name: str | None = None) -> ServedModel:
    """A run directory or a pretrained name, on the chosen runtime and serving plan, warmed up at every bucket."""
    if run_dir is not None and _input_kind(run_dir) == "tokens":
        opener = _text_opener(settings, run_dir)
    else:
        opener = _image_opener(settings, run_dir, model)
    # The cuDNN autotuner and TF32 of this precision (hardware.backends), for the plan's measurement, the
    # warm-up and every request after: the server's process runs this model until it exits.
    hardware.apply_gpu_settings(hardware.device_facts(settings.device), opener.precision)
    decision = decide_plan(opener, settings)
    buckets = batch_buckets(decision.plan.max_batch)
    rule = served_rule(settings.tta, opener.spec, run_dir or model)
    if rule.needs_features and not opener.feature_dim:
        rule = rule.softmax_only()
    engines = [opener.engine(buckets, decision.threads) for _ in range(decision.plan.instances)]
    # The architecture's name where none is given, as Triton's repository would name it: timm/<name> has a '/'
    # that no /v2/models/{name} route can carry.
    served = ServedModel(name or model_name(opener.spec.arch), opener.spec, opener.label, opener.backend, opener.precision,
                         next(iter(engines[0].sessions.values())).provider, engines, buckets[-1], opener.vectorizer,
                         opener.agreement, batching=decision.line(), max_delay_ms=decision.max_delay_ms, rule=rule,
                         max_request=settings.max_batch or hardware.AUTO_MAX_BATCH,
                         auto_limit=settings.max_batch is None, batch_rule=decision.rule,
                         feature_dim=opener.feature_dim)
    started = time.perf_counter()
    warm_up(served)
    served.warmup_s = time.perf_counter() - started
    # What ran, as the warm-up found it: a compiled model that fell back to eager says so (runtimes.py).
    served.provider = next(iter(engines[0].sessions.values())).provider
    return served


def served_rule(asked: str | None, spec: ModelSpec, what: Any) -> DecisionRule:
    """The spec's decision rule under --tta as asked (a fitted rule refuses another mode); image models only."""
    if asked not in (None, "none") and spec.input_kind != "image":
        raise UserError(f"{what}: --tta {asked} augments images; this model takes {spec.input_kind}")
    return spec.rule.under(asked, str(what))


@dataclass
class EngineOpener:
    """Everything decided about a model but its serving plan: opens engines for any buckets and threads."""

    label: str
    spec: ModelSpec
    backend: str
    precision: str
    open_session: Callable[[int, int | None], RuntimeSession]  # (batch, threads) -> a session
    dynamic_shapes: bool  # one session runs every bucket (else one per bucket: OpenVINO's static shapes)
    input_shape: list[int]
    input_dtype: Any = np.float32
    vectorizer: Any = None
    agreement: str | None = None
    feature_dim: int = 0  # penultimate features after the logits in each output (a rule with a kNN bank)

    def engine(self, buckets: list[int], threads: int | None) -> Engine:
        if self.dynamic_shapes:
            shared = self.open_session(buckets[-1], threads)
            return Engine({b: shared for b in buckets}, buckets)
        return Engine({b: self.open_session(b, threads) for b in buckets}, buckets)


def decide_plan(opener: EngineOpener, settings: ModelLoadSettings) -> hardware.ServeDecision:
    """Instances, max batch and max delay for this model here (hardware.decide_serving), with evidence."""
    device = torch.device(settings.device)
    cpus = hardware.usable_cpus()
    gpu = device.type == "cuda"
    if hardware.auto_is_safe():  # no timing: one instance, as set
        plan = hardware.ServePlan(settings.instances or 1, settings.max_batch or 1)
        delay = settings.max_delay_ms if settings.max_delay_ms is not None else (2.0 if plan.max_batch > 1 else 0.0)
        return hardware.ServeDecision(plan, delay, source="pinned",
                                      threads=None if gpu else hardware.instance_threads(cpus, plan.instances))
    plans = hardware.serve_plans(cpus, gpu, settings.instances, settings.max_batch)
    facts = hardware.device_facts(device)
    key = hardware.make_key("serve", facts, opener.spec.arch, opener.input_shape, hardware.AUTO_MAX_BATCH, cpus,
                            extra=f"{opener.backend}/{opener.precision}")
    return hardware.decide_serving(plans, lambda plan, seconds: saturation(opener, plan, cpus, gpu, seconds),
                                   cpus=cpus, gpu=gpu, key=key, cache=hardware.SpeedCache(), fresh=settings.fresh,
                                   delay_ms=settings.max_delay_ms, slo_ms=settings.slo_ms, host=host_work(opener))


# One request's host work is timed this many times (CPU time of this thread, the median): a few ms of start-up.
HOST_RUNS = 15
# A text as long as a long IMDB review (~1,000 words), for a text model's host work.
SAMPLE_TEXT = " ".join(["a film that moved me more than any other this year"] * 100)


def host_work(opener: EngineOpener) -> hardware.HostWork:
    """CPU seconds of one request's work outside the batches, measured here: an image model's sample
    picture (the package's first sample picture, what `loadtest` sends by default; a generated photo
    without it) decoded and transformed as a request's upload is, in the protocol's binary form, parsed
    and answered; a text model's long sample text tokenized. The plan charges it against the cores."""
    if opener.vectorizer is not None:
        return hardware.HostWork(_median_cpu(lambda: opener.vectorizer.encode([SAMPLE_TEXT])),
                                 f"a {len(SAMPLE_TEXT):,}-character text tokenized")
    data, what = _sample_upload()
    transform = opener.spec.eval_transform()
    body = json.dumps({"inputs": [{"name": ENCODED_INPUT, "datatype": "BYTES", "shape": [1, 1],
                                   "parameters": {"binary_data_size": len(data) + 4}}]}).encode()
    outputs = {name: np.zeros((1, opener.spec.num_classes), np.float32) for name in OUTPUTS}

    def one_request() -> None:
        request = parse_infer_request(body + encode_bytes_elements([data]), str(len(body)))
        preprocess_upload(request.inputs[0].data[0], "sample", opener.spec.resize_size, transform)
        encode_infer_response("model", "1", request, outputs)

    return hardware.HostWork(_median_cpu(one_request), f"{what} decoded and transformed, the protocol's binary form")


def _median_cpu(work: Callable[[], Any]) -> float:
    work()  # first call: lazy imports, allocation
    spent = []
    for _ in range(HOST_RUNS):
        started = time.thread_time()
        work()
        spent.append(time.thread_time() - started)
    return float(np.median(spent))


def _sample_upload() -> tuple[bytes, str]:
    """The bytes a client would upload, and what they are: the first sample picture, else a generated photo."""
    files = sample_image_files()
    if files:
        data = files[0].read_bytes()
    else:  # smooth colour fields compress like a photo; 640 x 480, JPEG quality 90
        pixels = np.random.default_rng(0).integers(0, 256, (20, 27, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).resize((640, 480), Image.BILINEAR).save(buffer, format="JPEG", quality=90)
        data = buffer.getvalue()
    with open_image(io.BytesIO(data), Path("sample")) as image:
        return data, f"a {image.size[0]}x{image.size[1]} {image.format}"


def saturation(opener: EngineOpener, plan: hardware.ServePlan, cpus: int, gpu: bool, seconds: float) -> float:
    """Images/s with `plan.instances` engines, each in its own thread with its share of the CPUs, running
    batches of `plan.max_batch` back to back: the most this plan can serve (what a load test saturates)."""
    threads = None if gpu else hardware.instance_threads(cpus, plan.instances)
    engines = [opener.engine([plan.max_batch], threads) for _ in range(plan.instances)]
    inputs = np.zeros((plan.max_batch, *opener.input_shape), opener.input_dtype)
    for engine in engines:
        engine.run(inputs)  # warm-up: kernel creation, first-call allocation
    start = threading.Barrier(plan.instances + 1)
    deadline = [0.0]
    counts = [0] * plan.instances

    def work(index: int) -> None:
        start.wait()
        while time.perf_counter() < deadline[0]:
            engines[index].run(inputs)
            counts[index] += plan.max_batch

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(plan.instances)]
    for worker in workers:
        worker.start()
    began = time.perf_counter()
    deadline[0] = began + max(0.5, min(2.0, seconds / 3))
    start.wait()
    for worker in workers:
        worker.join()
    return sum(counts) / (time.perf_counter() - began)


def _input_kind(run_dir: Path) -> str:
    return ModelSpec.load(RunDir.open(run_dir).spec_file).input_kind


def _text_opener(settings: ModelLoadSettings, run_dir: Path) -> EngineOpener:
    if settings.backend not in ("auto", "eager"):
        raise UserError(f"{run_dir}: text models run on --backend eager (the ONNX export covers image models)")
    if settings.precision not in ("auto", "fp32"):
        raise UserError(f"{run_dir}: text models run in fp32 (an embedding + LSTM-sized model gains nothing)")
    net, spec = load_run_model(run_dir)
    vectorizer = TextVectorizer.load(Path(run_dir) / spec.tokenizer)

    def open_session(batch: int, threads: int | None) -> RuntimeSession:
        return TorchSession(net, "fp32", "nchw", settings.device, batch, threads=threads)

    return EngineOpener(str(run_dir), spec, "eager", "fp32", open_session, True, [vectorizer.seq_len], np.int64,
                        vectorizer)


def _image_opener(settings: ModelLoadSettings, run_dir: Path | None, model: str | None) -> EngineOpener:
    """Backend and precision for an image model: the probe's candidates, each checked by the agreement rule."""
    source = load_source(run_dir=run_dir, model=model, weights=settings.weights, out=settings.exports)
    knn = source.spec.rule.knn
    backend = auto_backend(settings.device, "image") if settings.backend == "auto" else settings.backend
    if knn is not None and backend not in FEATURE_BACKENDS:
        if settings.backend == "auto":
            settings.log(f"{source.label}: eager PyTorch, not {backend}: the decision rule's kNN detector reads the "
                         "model's penultimate features, which the exported graph does not output")
            backend = "eager"
        else:
            settings.log(f"{source.label}: --backend {backend} runs the exported graph, which outputs logits only: "
                         "answers by the softmax rule alone, without the kNN detector (--backend eager applies it)")
    runtime = get_runtime(backend)
    runtime.require()
    artifacts = Artifacts(source, log=settings.log)
    facts = hardware.device_facts(settings.device)
    candidates, layout = _precision_candidates(settings, backend, runtime, source, facts)
    for precision in candidates:
        def open_session(batch: int, threads: int | None, precision: str = precision) -> RuntimeSession:
            return runtime.open(artifacts, precision, layout, Target(settings.device, threads=threads), batch)

        opener = EngineOpener(source.label, source.spec, backend, precision, open_session,
                              runtime.name != "openvino", list(source.spec.input_shape))
        try:
            verdict = _check(opener, artifacts, settings)
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
        opener.agreement = verdict.reason if verdict else None
        if knn is not None and backend in FEATURE_BACKENDS:  # after the agreement check, which compares logits
            source.model = WithFeatures(source.model, head_name(source.model, source.spec.num_classes)).eval()
            opener.feature_dim = knn.dim
        return opener
    raise UserError(f"{source.label}: no usable precision on {backend} (see the lines above)")


def _precision_candidates(settings: ModelLoadSettings, backend: str, runtime: Any, source: Any,
                          facts: hardware.DeviceFacts) -> tuple[list[str], str]:
    """(precisions to try in order, layout). auto: what the probe allows; on PyTorch backends measured
    (infer/speed.py); fp32 is always the fallback the agreement rule can fall back to."""
    layout = NATIVE_LAYOUT if runtime.layouts == (NATIVE_LAYOUT,) else "nchw"
    requested = settings.precision
    if requested != "auto":
        if requested not in PRECISIONS:
            raise UserError(f"--precision {requested!r}: use auto or one of {', '.join(PRECISIONS)}")
        warning = hardware.emulation_warning(facts, requested)
        if warning:
            settings.log(f"warning: {warning}")
        return [requested], layout
    if layout != NATIVE_LAYOUT:  # PyTorch backends: time precision and memory format on this model
        decision = decide_inference(source.model, source.spec.arch, tuple(source.spec.input_shape),
                                    settings.max_batch or 1, torch.device(settings.device))
        settings.log(f"{source.label}: {decision.line(f'{backend} precision and layout')}")
        layout = "channels_last" if decision.choice.channels_last else "nchw"
        return list(dict.fromkeys([decision.choice.precision, "fp32"])), layout
    options, ruled_out = hardware.precision_options(facts, training=False)
    for name, why in ruled_out.items():
        if name in runtime.precisions:
            settings.log(f"{source.label}: {backend} {name} not tried: {why}")
    # Reduced precisions first (faster where the device has units for them), fp32 the fallback.
    return [p for p in ("bf16", "fp16") if p in options and p in runtime.precisions] + ["fp32"], layout


def _check(opener: EngineOpener, artifacts: Artifacts, settings: ModelLoadSettings) -> Any:
    """Open the precision once (an Unsupported precision fails here) and apply the agreement rule to reduced ones."""
    if opener.precision not in REDUCED_PRECISIONS:
        return None  # fp32 runs everywhere: nothing to check, no engine to build and throw away
    largest = settings.max_batch or hardware.AUTO_MAX_BATCH
    if opener.precision == "int8" and artifacts.sets is None:
        artifacts.sets = _image_sets(artifacts)  # calibration images, before the quantizer asks
    return _agreement(artifacts, opener.engine([largest], None), settings)


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
