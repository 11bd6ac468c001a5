"""Static int8 quantization calibrated on real images, and the rule that decides if it is usable.

Two quantizers, both well-kept libraries:

- ONNX Runtime (`onnxruntime.quantization.quantize_static`): QDQ format, per-channel int8 weights,
  uint8 activations, min/max ranges averaged over calibration batches, the first convolution and the
  classifier left in fp32. On this project's AVX-512 VNNI CPU u8 activations x s8 weights ran 1.5x
  faster than s8 x s8 (MLAS has a VNNI u8s8 kernel; s8s8 goes through a slower path).
- NNCF (`nncf.quantize`) for OpenVINO, with its default mixed preset and fast bias correction.

Calibration and held-out images are disjoint subsets of the same real pictures (seed 0 shuffle).
A reduced-precision model is *usable* only when its top-1 prediction agrees with fp32 PyTorch on at
least MIN_AGREEMENT of at least MIN_HOLDOUT_IMAGES held-out images. A random-weight model has near-tied
logits, so its agreement says little; measure it on a trained model (README: Fast inference).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np

from inceptionlab.errors import UserError
from inceptionlab.fileio import atomic_write_bytes, sha256_file
from inceptionlab.host import name_os_thread, package_versions
from inceptionlab.infer.inputs import load_images, normalize, shuffled
from inceptionlab.infer.onnx_graph import INPUT_NAME
from inceptionlab.models.spec import ModelSpec

MIN_AGREEMENT = 0.99  # top-1 agreement with fp32 on the held-out set
MIN_HOLDOUT_IMAGES = 200  # below this, 99% cannot be told from 97% (+-1.4% std. error at n=200)
CALIBRATION_IMAGES = 100  # min/max ranges settle after ~50-100 images; NNCF's default subset is 300
CALIBRATION_BATCH = 10  # 100 images = 10 equal batches for the moving-average min/max


def quiet_stdout() -> contextlib.AbstractContextManager[Any]:
    """Libraries that print progress (nncf, the exporter) must not mix with --json on stdout."""
    return contextlib.redirect_stdout(sys.stderr if sys.stderr else io.StringIO())


# --------------------------------------------------------------------------------------- images


@dataclass
class ImageSets:
    """Disjoint real-image sets: `calibration` sets int8 ranges, `holdout` judges agreement."""

    calibration: np.ndarray  # uint8 NCHW after the eval transform
    holdout: np.ndarray
    spec: ModelSpec

    def calibration_inputs(self) -> np.ndarray:
        return normalize(self.calibration, self.spec)

    def holdout_inputs(self) -> np.ndarray:
        return normalize(self.holdout, self.spec)

    def fingerprint(self) -> str:
        return hashlib.sha256(self.calibration.tobytes()).hexdigest()[:16]

    def describe(self) -> str:
        return f"{len(self.calibration)} calibration + {len(self.holdout)} held-out real images"


def image_sets(files: list[Path], spec: ModelSpec, calibration: int = CALIBRATION_IMAGES,
               holdout: int = MIN_HOLDOUT_IMAGES, holdout_files: list[Path] | None = None) -> ImageSets:
    """Shuffle (seed 0), then the first `holdout` readable images judge and the next `calibration`
    calibrate; with `holdout_files` (e.g. a val split) those judge and `files` (e.g. train) calibrate."""
    order = shuffled(files)
    if holdout_files:
        held = load_images(shuffled(holdout_files)[:holdout], spec)
        calib = load_images(order[:calibration], spec)
        return ImageSets(calib, held, spec)
    held = load_images(order[:holdout], spec)
    calib = load_images(order[holdout:holdout + calibration], spec)
    if len(calib) == 0 and len(held) > 1:
        # Too few images for two sets: calibrate on half of them rather than on nothing.
        half = len(held) // 2
        calib, held = held[:half], held[half:]
    return ImageSets(calib, held, spec)


# --------------------------------------------------------------------------------------- the rule


@dataclass
class Verdict:
    agreement: float | None  # fraction of held-out images whose top-1 matches fp32
    images: int
    usable: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"agreement": None if self.agreement is None else round(self.agreement, 4),
                "agreement_images": self.images, "usable": self.usable, "usable_reason": self.reason}


def judge(reference: np.ndarray, candidate: np.ndarray, min_agreement: float = MIN_AGREEMENT,
          min_images: int = MIN_HOLDOUT_IMAGES) -> Verdict:
    """Top-1 agreement of `candidate` logits with fp32 `reference` logits, and whether that is enough."""
    count = len(reference)
    if count == 0:
        return Verdict(None, 0, False, "no held-out images to check agreement on (pass --calib-images DIR)")
    agreement = float(np.mean(reference.argmax(axis=1) == candidate.argmax(axis=1)))
    if count < min_images:
        return Verdict(agreement, count, False, f"only {count} held-out images (< {min_images}): not enough to tell")
    if agreement < min_agreement:
        return Verdict(agreement, count, False, f"top-1 agreement {agreement:.1%} < {min_agreement:.0%}")
    return Verdict(agreement, count, True, f"top-1 agreement {agreement:.1%} >= {min_agreement:.0%} on {count} images")


# --------------------------------------------------------------------------------------- caching


def _cache_key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _version(name: str) -> str:
    return package_versions().get(name, "absent")


def _publish_dir(tmp: Path, target: Path) -> Path:
    """Move a finished temp folder into place in one rename; a concurrent twin may have won the race."""
    try:
        os.replace(tmp, target)
    except OSError:
        if not target.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return target


class _Batches:
    """onnxruntime's CalibrationDataReader protocol over an array of normalised images."""

    def __init__(self, inputs: np.ndarray, batch: int):
        self._chunks = iter([inputs[i:i + batch] for i in range(0, len(inputs), batch)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        chunk = next(self._chunks, None)
        return None if chunk is None else {INPUT_NAME: chunk}

    def rewind(self) -> None:  # part of the protocol; calibration reads the data once
        pass


# --------------------------------------------------------------------------------------- ONNX Runtime


def _fixed_batch(onnx_path: Path) -> int | None:
    """The graph's batch size when it is fixed (a --static-batch export), else None."""
    import onnx  # optional extra (onnx): imported on use, not at start-up

    dim = onnx.load(str(onnx_path), load_external_data=False).graph.input[0].type.tensor_type.shape.dim[0]
    return dim.dim_value if dim.HasField("dim_value") else None


def _sensitive_nodes(onnx_path: Path) -> list[str]:
    """The first convolution (raw pixels in) and the classifier (logits out): the layers whose
    int8 error flips top-1 most, and a negligible share of the compute."""
    import onnx  # optional extra (onnx): imported on use, not at start-up

    nodes = onnx.load(str(onnx_path), load_external_data=False).graph.node  # topologically sorted
    first_conv = [n.name for n in nodes if n.op_type == "Conv"][:1]
    classifier = [n.name for n in nodes if n.op_type in ("Gemm", "MatMul")][-1:]
    return first_conv + classifier


def onnxruntime_int8(onnx_path: Path, sets: ImageSets, cache: Path, batch: int | None = CALIBRATION_BATCH) -> Path:
    """QDQ int8 model (per-channel s8 weights, u8 activations, MinMax calibration), cached by input."""
    try:
        # optional extra (onnx): imported on use
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
        from onnxruntime.quantization.shape_inference import quant_pre_process  # optional extra (onnx): imported on use
    except ImportError:
        raise UserError("onnxruntime is not installed: pip install 'inceptionlab[onnx]'") from None
    if len(sets.calibration) == 0:
        raise UserError("no real images to calibrate int8 on: pass --calib-images DIR")
    settings = {"format": "QDQ", "per_channel": True, "activations": "u8", "weights": "s8",
                "method": "minmax-moving-average", "fp32": "first conv + classifier"}
    key = _cache_key(sha256_file(onnx_path), sets.fingerprint(), settings, _version("onnxruntime"))
    target = Path(cache) / f"ort-int8-{key}.onnx"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".quantize-") as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        quantized = Path(tmp) / "int8.onnx"
        with quiet_stdout():
            # Shape inference + Conv/BatchNorm folding first, as onnxruntime's docs recommend.
            quant_pre_process(str(onnx_path), str(prepared), skip_symbolic_shape=False)
            # Measured on the trained digits Inception v3 (300 held-out images, README): plain min/max
            # agreed 95.7% with fp32; averaging per-batch ranges 98.7%; also keeping the first conv
            # and the classifier in fp32 (0.3% of Inception's FLOPs) 99.3%.
            quantize_static(
                str(prepared), str(quantized), _Batches(sets.calibration_inputs(), _fixed_batch(onnx_path) or batch or 1),
                quant_format=QuantFormat.QDQ, per_channel=True,
                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax, extra_options={"CalibMovingAverage": True},
                nodes_to_exclude=_sensitive_nodes(prepared),
            )
        os.replace(quantized, target)
    return target


def onnxruntime_fp16(onnx_path: Path, cache: Path) -> Path:
    """fp16 weights and activations with fp32 inputs/outputs, for providers without an fp16 switch (CUDA)."""
    import onnx  # optional extra (onnx): imported on use, not at start-up
    from onnxruntime.transformers.float16 import convert_float_to_float16

    key = _cache_key(sha256_file(onnx_path), "fp16", _version("onnxruntime"))
    target = Path(cache) / f"ort-fp16-{key}.onnx"
    if not target.is_file():
        model = convert_float_to_float16(onnx.load(str(onnx_path)), keep_io_types=True)
        atomic_write_bytes(target, model.SerializeToString())
    return target


# --------------------------------------------------------------------------------------- OpenVINO + NNCF

T = TypeVar("T")


def openvino_in_own_thread(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` (anything that compiles OpenVINO CPU models) in a thread that ends when it returns.

    OpenVINO's CPU plugin (2026.4) gives the thread that compiles a model a signal stack of its own
    (sigaltstack, 11,568 bytes) and, when that compiled model is freed, puts back the stack it found.
    Freed out of compile order (A compiled, B compiled, A freed, B freed), the thread is left on A's
    stack, already unmapped; the next signal a Python handler takes on that thread (CPython installs
    them with SA_ONSTACK: Ctrl-C, the SIGCHLD handler of a DataLoader with workers) kills the process
    with SIGSEGV. docs/testing.md has the 30-line reproducer. Compiled in a thread that ends at once,
    no thread that lives on is ever left on such a stack.

    The CPU plugin starts its worker threads here, and they keep this thread's OS name (`openvino_0`):
    how `top -H` and benchmarks/serve_cpu.py tell OpenVINO's work from the server's own threads.
    """
    with ThreadPoolExecutor(1, thread_name_prefix="openvino", initializer=name_os_thread) as pool:
        return pool.submit(fn, *args).result()


def openvino_int8(onnx_path: Path, sets: ImageSets, cache: Path) -> Path:
    """NNCF post-training int8 model in OpenVINO IR (model.xml + model.bin), cached by input."""
    try:
        import nncf  # optional extra (openvino): ~2 s to import
        import openvino as ov
    except ImportError:
        raise UserError("openvino/nncf are not installed: pip install 'inceptionlab[openvino]'") from None
    if len(sets.calibration) == 0:
        raise UserError("no real images to calibrate int8 on: pass --calib-images DIR")
    key = _cache_key(sha256_file(onnx_path), sets.fingerprint(), "nncf-mixed", _version("nncf"), _version("openvino"))
    target = Path(cache) / f"openvino-int8-{key}"
    if (target / "model.xml").is_file():
        return target / "model.xml"
    target.parent.mkdir(parents=True, exist_ok=True)
    nncf.set_log_level(logging.ERROR)
    inputs = sets.calibration_inputs()
    dataset = nncf.Dataset([inputs[i:i + 1] for i in range(len(inputs))])
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".openvino-int8-"))
    try:
        with quiet_stdout():
            # NNCF compiles the model to collect its statistics: in a thread of its own (see above).
            network = ov.Core().read_model(str(onnx_path))
            quantized = openvino_in_own_thread(lambda: nncf.quantize(network, dataset, subset_size=len(inputs)))
        # Keep fp32 for the layers left unquantized: fp16 compression would add its own error.
        ov.save_model(quantized, str(tmp / "model.xml"), compress_to_fp16=False)
        return _publish_dir(tmp, target) / "model.xml"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
