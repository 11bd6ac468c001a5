"""Runtimes: one protocol over eager PyTorch, torch.compile, ONNX Runtime and OpenVINO.

A runtime is picked by name from RUNTIMES and asked to `open` a RuntimeSession for one precision, layout
and batch size. Every session takes the same input (float32 NCHW, normalised, as a numpy array),
`place`s it where it computes (host or GPU memory), `run`s synchronously (device work finished when
it returns, output left where it was computed) and reports `provider`: what actually ran.

What is installed is discovered at run time. A provider that is asked for and missing is an error
that names what is installed; ONNX Runtime's habit of quietly falling back to the CPU when a GPU
provider fails to load is caught and reported, never timed as if it were the GPU.

Compiled and tuned artifacts live on disk under the model's exports/cache/ and are reused:
ORT-optimized graphs, int8/fp16 models, TensorRT engines, MIGraphX programs, OpenVINO blobs and
the Inductor cache of torch.compile.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import logging
import os
import platform
import threading
import weakref
from abc import ABC, abstractmethod
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator

import numpy as np
import torch

from inceptionlab import hardware
from inceptionlab.errors import ProgramError, UserError, summary_of
from inceptionlab.fileio import sha256_file
from inceptionlab.host import cpu_model_name
from inceptionlab.infer.export import ensure_export
from inceptionlab.infer.onnx_graph import INPUT_NAME, OUTPUT_NAME, check_onnx_file, import_onnxruntime
from inceptionlab.infer.quantize import (
    ImageSets,
    onnxruntime_fp16,
    onnxruntime_int8,
    openvino_in_own_thread,
    openvino_int8,
)
from inceptionlab.infer.source import ModelSource
from inceptionlab.runtime import AUTOCAST_DTYPES, cpu_capability
from inceptionlab.torch_build import ORT_CPU, ORT_NVIDIA, migraphx_advice

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16", "fp16", "int8")
REDUCED_PRECISIONS = ("bf16", "fp16", "int8")
TORCH_LAYOUTS = ("nchw", "channels_last")
NATIVE_LAYOUT = "native"  # ONNX Runtime and OpenVINO pick their own (e.g. MLAS NCHWc blocks)


class Unsupported(Exception):
    """This runtime cannot run this precision/layout on this device; the bench skips it, saying why."""


@dataclass(frozen=True)
class Target:
    device: str = "cpu"  # "cpu", "cuda" or "cuda:N" from runtime.resolve_device (a ROCm GPU is "cuda" too)
    provider: str = "auto"  # ONNX Runtime execution provider: auto, cpu, cuda, tensorrt, migraphx
    tune: bool = False  # max-autotune / exhaustive kernel search: slower first call, faster after
    # CPU threads this session may use (serve gives each instance its share: hardware.instance_threads);
    # None: the runtime's default, every core.
    threads: int | None = None

    @property
    def device_type(self) -> str:
        return torch.device(self.device).type

    @property
    def device_index(self) -> int:
        """The GPU's index, for runtimes that take one (ONNX Runtime's device_id): `cuda:N` is N, plain
        `cuda` torch's current device (0 until torch has initialised CUDA: asking would initialise it); 0
        on the CPU."""
        device = torch.device(self.device)
        if device.type != "cuda":
            return 0
        if device.index is not None:
            return device.index
        return torch.cuda.current_device() if torch.cuda.is_initialized() else 0


@dataclass
class Artifacts:
    """Files the ONNX runtimes need, made on first use (export, quantization) and cached on disk."""

    source: ModelSource
    images: list[Path] | None = None  # for the export's parity check
    sets: ImageSets | None = None  # calibration images for int8
    onnx_override: Path | None = None  # --onnx FILE instead of the source's own export
    log: Callable[[str], None] = lambda message: None
    _made: dict[str, Path] = field(default_factory=dict)

    @property
    def cache(self) -> Path:
        return self.source.cache

    def onnx(self) -> Path:
        if "fp32" not in self._made:
            if self.onnx_override is not None:
                check_onnx_file(self.onnx_override, self.source.spec)
                self._made["fp32"] = self.onnx_override
            else:
                self._made["fp32"] = ensure_export(self.source, self.images, self.log)
        return self._made["fp32"]

    def _calibrated(self, kind: str, make: Callable[[Path, ImageSets, Path], Path]) -> Path:
        if kind not in self._made:
            if self.sets is None or len(self.sets.calibration) == 0:
                raise UserError("int8 needs real calibration images: pass --calib-images DIR")
            self.log(f"quantizing for {kind} on {self.sets.describe()} (cached in {self.cache})")
            self._made[kind] = make(self.onnx(), self.sets, self.cache)
        return self._made[kind]

    def onnx_int8(self) -> Path:
        return self._calibrated("onnxruntime-int8", onnxruntime_int8)

    def openvino_int8(self) -> Path:
        return self._calibrated("openvino-int8", openvino_int8)

    def onnx_fp16(self) -> Path:
        if "fp16" not in self._made:
            self._made["fp16"] = onnxruntime_fp16(self.onnx(), self.cache)
        return self._made["fp16"]


# --------------------------------------------------------------------------------------- protocol


class RuntimeSession(ABC):
    """One model, loaded for one precision and batch size, ready to run."""

    provider: str  # what actually runs, e.g. "CPUExecutionProvider", "OpenVINO CPU bf16"
    batch: int

    @abstractmethod
    def place(self, inputs: np.ndarray) -> Any:
        """Put a float32 NCHW batch where this runtime reads it (not timed)."""

    @abstractmethod
    def run(self, placed: Any) -> Any:
        """One inference, returning when the device has finished; the output stays where it is."""

    @abstractmethod
    def to_numpy(self, output: Any) -> np.ndarray:
        """float32 host copy of `run`'s output."""

    def predict(self, inputs: np.ndarray) -> np.ndarray:
        """Logits for any number of inputs, in chunks of this session's batch (the last one padded)."""
        outputs = []
        for start in range(0, len(inputs), self.batch):
            chunk = inputs[start:start + self.batch]
            padded = np.concatenate([chunk, np.repeat(chunk[-1:], self.batch - len(chunk), 0)])
            outputs.append(self.to_numpy(self.run(self.place(np.ascontiguousarray(padded))))[: len(chunk)])
        return np.concatenate(outputs) if outputs else np.zeros((0, 0), np.float32)


class Runtime(ABC):
    name: ClassVar[str]
    precisions: ClassVar[tuple[str, ...]]
    layouts: ClassVar[tuple[str, ...]] = (NATIVE_LAYOUT,)
    summary: ClassVar[str]

    @classmethod
    def missing(cls) -> str | None:
        """Why this runtime cannot be used at all here (not installed), or None."""
        return None

    @classmethod
    def details(cls) -> str:
        return ""

    @classmethod
    @abstractmethod
    def open(cls, artifacts: Artifacts, precision: str, layout: str, target: Target, batch: int) -> RuntimeSession:
        """A session for this configuration; raises Unsupported or UserError with the reason."""

    @classmethod
    def require(cls) -> None:
        reason = cls.missing()
        if reason:
            raise UserError(f"{cls.name}: {reason}")

    @classmethod
    def check_precision(cls, precision: str) -> None:
        if precision not in cls.precisions:
            raise Unsupported(f"{cls.name} has no {precision} path (it runs {', '.join(cls.precisions)})")


# --------------------------------------------------------------------------------------- PyTorch



INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


@contextmanager
def inductor_cache_at(directory: Path) -> Iterator[None]:
    """Inductor's on-disk caches (FX graphs, kernels) in `directory` for what runs inside, the environment
    as it was after. Inductor reads the folder from TORCHINDUCTOR_CACHE_DIR and has no per-compile
    setting, so the variable is set around each compile only, where dynamo's global compile lock keeps
    two compiles from overlapping; setting it for the process (as a `setdefault` once did) made the first
    model's folder every later model's cache too."""
    try:
        # start-up time: Inductor only where compiling; it also clears Inductor's path-keyed caches
        from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir
    except ImportError:  # torch before 2.7 (a GPU container's own build): set and restore the variable here
        previous = os.environ.get(INDUCTOR_CACHE_ENV)
        os.environ[INDUCTOR_CACHE_ENV] = str(directory)
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop(INDUCTOR_CACHE_ENV, None)
            else:
                os.environ[INDUCTOR_CACHE_ENV] = previous
        return
    with temporary_cache_dir(str(directory)):
        yield


# Graphs one compiled configuration may hold before dynamo falls back to eager, where torch.compile takes
# a per-call limit (2.14: recompile_limit with isolate_recompiles, so configurations do not count against
# each other; older torch: dynamo's global recompile_limit, 8). A configuration needs one graph per batch
# size with static shapes (buckets 1..64: 7), two with a dynamic batch dimension.
RECOMPILE_LIMIT = 16


class GraphCalls(threading.local):
    """Calls of compiled graphs, per thread: a call of the compiled model that ran none fell back to eager."""

    count = 0


def inductor_backend(cache: Path, mode: str | None, counts: CompiledModel | None = None) -> Callable[..., Any]:
    """torch.compile's Inductor (with `mode`'s options) compiling into `cache`: a backend function, so
    every compile and recompile (a new batch size) of this configuration uses this model's cache.

    Freezing (weights folded into the graph, oneDNN prepacking them once: inference only) is one of the
    compile's own config patches: a process-wide `inductor.config.patch` around each call changed it
    for every thread at once. With `counts`, the graphs compiled and their calls are counted there.
    """
    # start-up time: Inductor (~1.5 s beside torch) only where compiling
    from torch._inductor import compile_fx as inductor
    from torch._inductor import list_mode_options

    patches = {**(list_mode_options(mode, False) if mode else {}), "freezing": True}

    def compile_into_cache(graph: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        with inductor_cache_at(cache):
            compiled = inductor.compile_fx(graph, example_inputs, config_patches=patches)
        if counts is None:
            return compiled
        counts.graphs += 1
        return _counted(compiled, counts.calls)

    return compile_into_cache


def _counted(compiled: Callable[..., Any], calls: GraphCalls) -> Callable[..., Any]:
    """`compiled`, counting its calls (dynamo calls a backend's result with the graph's inputs as
    arguments, as Inductor's own output takes them)."""
    def run(*args: Any) -> Any:
        calls.count += 1
        return compiled(*args)

    return run


@dataclass
class CompiledModel:
    """One torch.compile of one configuration (model, precision, layout, device, mode), shared by every
    session of it: serving instances, bucket sizes, plans timed at start-up and the agreement check."""

    dynamic_batch: bool
    calls: GraphCalls = field(default_factory=GraphCalls)
    fn: Callable[[torch.Tensor], torch.Tensor] | None = None
    graphs: int = 0  # compiled so far (each batch size with static shapes; batch 1 and the rest, dynamic)
    fell_back: bool = False


# Compiled configurations of each source model, dropped with it (a model freed and another allocated at
# its address never finds the first one's graphs).
_COMPILED: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, CompiledModel]] = weakref.WeakKeyDictionary()
_COMPILED_LOCK = threading.Lock()


def compiled_model(model: torch.nn.Module, precision: str, layout: str, device: torch.device, mode: str | None,
                   cache: Path, dynamic_batch: bool) -> CompiledModel:
    """The configuration's compiled model, made on first use: a private copy of `model` in the layout
    and on the device, compiled with the batch dimension dynamic or each batch size static."""
    key = (precision, layout, str(device), mode, str(cache), dynamic_batch)
    with _COMPILED_LOCK:
        known = _COMPILED.setdefault(model, {})
        if key not in known:
            memory_format = torch.channels_last if layout == "channels_last" else torch.contiguous_format
            copied = copy.deepcopy(model).to(device, memory_format=memory_format).eval()
            made = CompiledModel(dynamic_batch)
            options: dict[str, Any] = {"backend": inductor_backend(cache, mode, made),
                                       "dynamic": None if dynamic_batch else False}
            accepted = inspect.signature(torch.compile).parameters
            if "isolate_recompiles" in accepted and "recompile_limit" in accepted:
                options.update(isolate_recompiles=True, recompile_limit=RECOMPILE_LIMIT)
            made.fn = torch.compile(copied, **options)
            known[key] = made
        return known[key]


class TorchSession(RuntimeSession):
    """Eager PyTorch, or torch.compile's Inductor when `compile_cache` names the folder of its caches
    (one compile per configuration, `compiled_model`, shared by every session of it)."""

    def __init__(self, model: torch.nn.Module, precision: str, layout: str, device: str, batch: int,
                 compile_mode: str | None = None, compile_cache: Path | None = None, threads: int | None = None,
                 dynamic_batch: bool = True):
        self.device, self.batch, self.threads = torch.device(device), batch, threads
        self.memory_format = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        self.dtype = AUTOCAST_DTYPES[precision]
        self.compiled: CompiledModel | None = None
        if compile_cache is not None:
            self.compiled = compiled_model(model, precision, layout, self.device, compile_mode, compile_cache,
                                           dynamic_batch)
            self.fn: Callable[[torch.Tensor], torch.Tensor] = self.compiled.fn
        else:
            # A private copy: layouts of one configuration never leak into the next.
            self.fn = copy.deepcopy(model).to(self.device, memory_format=self.memory_format).eval()
        # Inductor's freezing folds weights into the graph (oneDNN prepacks them once): no_grad, not
        # inference_mode, around compiled calls.
        self.grad_mode: Callable[[], Any] = torch.no_grad if self.compiled else torch.inference_mode
        batch_kind = ("dynamic batch" if dynamic_batch else "static batch") + ", "
        kind = (f"torch.compile ({compile_mode or 'default'}, {batch_kind if self.compiled else ''}inductor)"
                if self.compiled else "torch eager")
        self.provider = f"{kind} {self.device.type} " + (f"autocast {precision}" if self.dtype else "fp32")

    def place(self, inputs: np.ndarray) -> torch.Tensor:
        placed = torch.from_numpy(inputs).to(self.device).contiguous(memory_format=self.memory_format)
        if self.compiled is not None and self.compiled.dynamic_batch and len(placed) > 1:
            # One graph for every batch size from 2 on (dynamo specialises 0 and 1 anyway): batch 1 and
            # this one are all the graphs a configuration compiles, whatever its buckets.
            torch._dynamo.mark_dynamic(placed, 0)
        return placed

    def run(self, placed: torch.Tensor) -> torch.Tensor:
        if self.threads and self.device.type == "cpu" and torch.get_num_threads() != self.threads:
            # OpenMP's team size is a per-thread setting: each serving instance's worker thread sets its own.
            torch.set_num_threads(self.threads)
        autocast = torch.autocast(self.device.type, dtype=self.dtype) if self.dtype else nullcontext()
        before = self.compiled.calls.count if self.compiled is not None else 0
        with self.grad_mode(), autocast:
            output = self.fn(placed)
        if self.compiled is not None and self.compiled.calls.count == before:
            self._fell_back(len(placed))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return output

    def _fell_back(self, batch: int) -> None:
        """The compiled model ran no compiled graph: dynamo ran it eager (its recompile limit reached, or
        a graph it could not compile). Said once per configuration, and in this session's provider."""
        if not self.provider.endswith(FELL_BACK):
            self.provider += FELL_BACK
        if not self.compiled.fell_back:
            self.compiled.fell_back = True
            log.warning("torch.compile fell back to eager for %s at batch %d: dynamo's recompile limit was reached "
                        "or the graph could not be compiled (TORCH_LOGS=recompiles,graph_breaks says which); the "
                        "figures of this configuration are eager PyTorch's", self.provider.removesuffix(FELL_BACK),
                        batch)

    def to_numpy(self, output: torch.Tensor) -> np.ndarray:
        return output.float().cpu().numpy()


FELL_BACK = " (fell back to eager)"


def _torch_precision_check(precision: str, device: str) -> None:
    if device == "cuda" and precision == "bf16" and not torch.cuda.is_bf16_supported():
        raise Unsupported("this GPU has no bf16; use fp16")


class EagerRuntime(Runtime):
    name = "eager"
    precisions = ("fp32", "bf16", "fp16")
    layouts = TORCH_LAYOUTS
    summary = "PyTorch eager; bf16/fp16 by autocast; NCHW or channels_last"

    @classmethod
    def details(cls) -> str:
        return f"torch {torch.__version__}, {torch.get_num_threads()} threads"

    @classmethod
    def open(cls, artifacts: Artifacts, precision: str, layout: str, target: Target, batch: int) -> RuntimeSession:
        cls.check_precision(precision)
        _torch_precision_check(precision, target.device_type)
        return TorchSession(artifacts.source.model, precision, layout, target.device, batch, threads=target.threads)


class CompileRuntime(Runtime):
    name = "compile"
    precisions = ("fp32", "bf16", "fp16")
    layouts = TORCH_LAYOUTS
    summary = "torch.compile (Inductor, frozen weights); --tune: mode max-autotune"

    @classmethod
    def details(cls) -> str:
        return "Inductor; compiles on the first call (reported as first_ms)"

    @classmethod
    def open(cls, artifacts: Artifacts, precision: str, layout: str, target: Target, batch: int) -> RuntimeSession:
        cls.check_precision(precision)
        _torch_precision_check(precision, target.device_type)
        # Inductor's on-disk caches (FX graphs, kernels) under the model's cache: a second run reuses them.
        mode = "max-autotune" if target.tune else None
        dynamic, _ = hardware.compile_dynamic_batch(hardware.device_facts(target.device))
        return TorchSession(artifacts.source.model, precision, layout, target.device, batch, mode,
                            compile_cache=artifacts.cache / "inductor", threads=target.threads, dynamic_batch=dynamic)


# --------------------------------------------------------------------------------------- ONNX Runtime


def _flag(value: bool) -> str:
    return "1" if value else "0"


def _no_options(precision: str, cache: Path, target: Target, shape: str) -> dict[str, str]:
    return {}


def _cuda_options(precision: str, cache: Path, target: Target, shape: str) -> dict[str, str]:
    # The cuDNN settings PyTorch's rows get (hardware.backends): EXHAUSTIVE tries every cuDNN algorithm
    # once per shape (what cudnn.benchmark does), HEURISTIC asks cuDNN; TF32 for fp32 where it is on.
    settings = hardware.settings_for(hardware.device_facts(target.device), precision)
    tuned = target.tune or (settings is not None and settings.cudnn_benchmark)
    return {"device_id": str(target.device_index), "cudnn_conv_algo_search": "EXHAUSTIVE" if tuned else "HEURISTIC",
            "use_tf32": _flag(settings is not None and settings.tf32)}


def _tensorrt_options(precision: str, cache: Path, target: Target, shape: str) -> dict[str, str]:
    # One optimisation profile per batch size; engines and timing caches are reused across runs.
    return {
        "device_id": str(target.device_index),
        "trt_fp16_enable": _flag(precision == "fp16"),
        "trt_int8_enable": _flag(precision == "int8"),  # the QDQ model carries its own scales
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": str(cache / "tensorrt"),
        "trt_timing_cache_enable": "1",
        "trt_timing_cache_path": str(cache / "tensorrt"),
        "trt_builder_optimization_level": "5" if target.tune else "3",
        "trt_profile_min_shapes": shape, "trt_profile_opt_shapes": shape, "trt_profile_max_shapes": shape,
    }


def _migraphx_options(precision: str, cache: Path, target: Target, shape: str) -> dict[str, str]:
    # The guide's MIGraphX step: compile (cached on disk) and, with --tune, exhaustive kernel tuning.
    return {
        "device_id": str(target.device_index),
        "migraphx_fp16_enable": _flag(precision == "fp16"),
        "migraphx_exhaustive_tune": _flag(target.tune),
        "migraphx_model_cache_dir": str(cache / "migraphx"),
    }


@dataclass(frozen=True)
class OrtProvider:
    ep: str  # ONNX Runtime's name for it
    device: str  # cpu or cuda
    precisions: tuple[str, ...]
    options: Callable[[str, Path, Target, str], dict[str, str]]
    io_device: str  # where inputs/outputs are bound (OrtValue device type)
    own_cache: bool  # compiles into its own engine cache: ORT's optimized-graph cache is not used
    fp16_model: bool = False  # needs an fp16-converted graph (no fp16 switch of its own)
    # One ONNX Runtime package per environment (torch_build.py): the GPU one replaces the CPU one.
    install: str = (f"`pip uninstall -y {ORT_CPU} && pip install {ORT_NVIDIA}` (`make clean setup` picks it where "
                    "torch sees an NVIDIA GPU)")


ORT_PROVIDERS: dict[str, OrtProvider] = {
    "cpu": OrtProvider("CPUExecutionProvider", "cpu", ("fp32", "int8"), _no_options, "cpu", False,
                       install=f"pip install {ORT_CPU}"),
    "cuda": OrtProvider("CUDAExecutionProvider", "cuda", ("fp32", "fp16", "int8"), _cuda_options, "cuda", False,
                        fp16_model=True),
    "tensorrt": OrtProvider("TensorrtExecutionProvider", "cuda", ("fp32", "fp16", "int8"), _tensorrt_options,
                            "cuda", True, install=f"{OrtProvider.install} and NVIDIA's TensorRT (`pip install tensorrt`)"),
    # MIGraphX is ONNX Runtime's AMD GPU provider (the ROCm provider was removed in ORT 1.23).
    # Inputs stay on the host: its device allocator is not exposed to Python's OrtValue.
    "migraphx": OrtProvider("MIGraphXExecutionProvider", "cuda", ("fp32", "fp16", "int8"), _migraphx_options,
                            "cpu", True, install=migraphx_advice("python")),
}


def ort_installed_providers() -> list[str]:
    try:
        import onnxruntime  # optional extra (onnx): imported on use, not at start-up
    except ImportError:
        return []
    return list(onnxruntime.get_available_providers())


def check_provider_name(name: str) -> None:
    """A one-line error for a provider name ONNX Runtime does not have (before anything is loaded)."""
    if name == "rocm":
        raise UserError("--provider rocm: ONNX Runtime removed its ROCm provider (1.23); use --provider migraphx")
    if name != "auto" and name not in ORT_PROVIDERS:
        raise UserError(f"--provider {name!r}: use auto or one of {', '.join(ORT_PROVIDERS)}")


def choose_ort_provider(target: Target) -> OrtProvider:
    """The provider asked for, or the natural one for the device; missing: an error naming the fix."""
    check_provider_name(target.provider)
    installed = ort_installed_providers()
    if target.provider == "auto":
        candidates = ["cpu"] if target.device_type == "cpu" else (["migraphx"] if torch.version.hip else ["cuda", "tensorrt"])
    else:
        candidates = [target.provider]
    for name in candidates:
        if ORT_PROVIDERS[name].ep in installed:
            provider = ORT_PROVIDERS[name]
            if provider.device != target.device_type:
                raise UserError(f"--provider {name} runs on {provider.device}, not --device {target.device}")
            return provider
    wanted = ORT_PROVIDERS[candidates[0]]
    raise UserError(f"onnxruntime has no {wanted.ep} here (installed: {', '.join(installed) or 'none'}): "
                    f"{wanted.install}, or pick another with --provider / --device")


_SHA_CACHE: dict[tuple[str, float, int], str] = {}


def _sha_of(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_mtime, stat.st_size)
    if key not in _SHA_CACHE:
        _SHA_CACHE[key] = sha256_file(path)
    return _SHA_CACHE[key]


def _machine() -> str:
    return f"{cpu_model_name()}|{cpu_capability()}|{platform.machine()}"


class OrtSession(RuntimeSession):
    def __init__(self, model: Path, provider: OrtProvider, precision: str, target: Target, batch: int,
                 cache: Path, input_shape: tuple[int, ...]):
        ort = import_onnxruntime()
        self.ort, self.batch, self.io_device = ort, batch, provider.io_device
        # Inputs and outputs bound on the run's GPU (host memory for MIGraphX): the provider's device_id.
        self.io_device_id = target.device_index if provider.io_device == "cuda" else 0
        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if target.threads:  # this instance's share of the cores; one graph at a time per session
            options.intra_op_num_threads, options.inter_op_num_threads = target.threads, 1
        model, publish = self._optimized_graph_cache(model, provider, options, cache)
        shape = f"{INPUT_NAME}:{batch}x" + "x".join(map(str, input_shape))
        provider_options = provider.options(precision, cache, target, shape)
        for folder in ("tensorrt", "migraphx"):
            if folder in str(provider_options.values()):
                (cache / folder).mkdir(parents=True, exist_ok=True)
        # CPU as the second provider: ORT places the odd node a GPU provider lacks there (a node-level
        # fallback, not the whole model, which the check below catches).
        providers = [(provider.ep, provider_options)]
        if provider.ep != "CPUExecutionProvider":
            providers.append("CPUExecutionProvider")  # type: ignore[arg-type]
        try:
            self.session = ort.InferenceSession(str(model), options, providers=providers)
        except Exception as exc:  # a graph export checked: onnxruntime's (or its libraries') failure
            raise ProgramError(f"{model}: onnxruntime could not load it with {provider.ep} ({summary_of(exc)})") from exc
        ran = self.session.get_providers()[0]
        if ran != provider.ep:
            raise UserError(f"onnxruntime fell back from {provider.ep} to {ran}: its libraries did not load "
                            "(CUDA/cuDNN/TensorRT/MIGraphX versions); not timing that as the GPU")
        publish()
        self.provider = ran
        self.binding = self.session.io_binding()

    def _optimized_graph_cache(self, model: Path, provider: OrtProvider, options: Any,
                               cache: Path) -> tuple[Path, Callable[[], None]]:
        """Reuse the graph ORT optimized last time (fused, NCHWc-blocked: specific to this CPU and
        version, hence the key); else have ORT save it, then move it into place atomically."""
        if provider.own_cache:
            return model, lambda: None
        key = hashlib.sha256("|".join([_sha_of(model), provider.ep, self.ort.__version__, _machine()]).encode())
        cached = cache / f"ort-optimized-{key.hexdigest()[:16]}.onnx"
        if cached.is_file():
            options.graph_optimization_level = self.ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            return cached, lambda: None
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f".{cached.name}.{os.getpid()}.tmp"
        options.optimized_model_filepath = str(tmp)

        def publish() -> None:
            if tmp.is_file():
                os.replace(tmp, cached)

        return model, publish

    def place(self, inputs: np.ndarray) -> Any:
        return self.ort.OrtValue.ortvalue_from_numpy(inputs, self.io_device, self.io_device_id)

    def run(self, placed: Any) -> Any:
        self.binding.bind_ortvalue_input(INPUT_NAME, placed)
        self.binding.bind_output(OUTPUT_NAME, self.io_device, self.io_device_id)
        # Synchronous: ORT waits for the device stream before returning (its default).
        self.session.run_with_iobinding(self.binding)
        return self.binding.get_outputs()[0]

    def to_numpy(self, output: Any) -> np.ndarray:
        return np.asarray(output.numpy(), dtype=np.float32)


class OnnxRuntime(Runtime):
    name = "onnxruntime"
    precisions = ("fp32", "fp16", "int8")
    summary = "ONNX Runtime: CPU always; CUDA, TensorRT, MIGraphX providers when installed; int8 = QDQ"

    @classmethod
    def missing(cls) -> str | None:
        return None if ort_installed_providers() else "onnxruntime is not installed: pip install 'inceptionlab[onnx]'"

    @classmethod
    def details(cls) -> str:
        import onnxruntime  # optional extra (onnx): imported on use, not at start-up

        return f"onnxruntime {onnxruntime.__version__}; providers: {', '.join(ort_installed_providers())}"

    @classmethod
    def open(cls, artifacts: Artifacts, precision: str, layout: str, target: Target, batch: int) -> RuntimeSession:
        cls.require()
        cls.check_precision(precision)
        provider = choose_ort_provider(target)
        if precision not in provider.precisions:
            raise Unsupported(f"onnxruntime {provider.ep} has no {precision} kernels for this model "
                              f"(it runs {', '.join(provider.precisions)})")
        model = {"fp32": artifacts.onnx, "int8": artifacts.onnx_int8,
                 "fp16": artifacts.onnx_fp16 if provider.fp16_model else artifacts.onnx}[precision]()
        return OrtSession(model, provider, precision, target, batch, artifacts.cache / "onnxruntime",
                          artifacts.source.spec.input_shape)


# --------------------------------------------------------------------------------------- OpenVINO

_OV_HINTS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}


class OpenVinoSession(RuntimeSession):
    def __init__(self, model: Path, precision: str, batch: int, cache: Path, input_shape: tuple[int, ...],
                 threads: int | None = None):
        import openvino as ov  # optional extra (openvino): imported on use, not at start-up

        self.batch = batch
        core = ov.Core()
        cache.mkdir(parents=True, exist_ok=True)
        core.set_property({"CACHE_DIR": str(cache)})  # compiled blobs, reused by the next run
        network = core.read_model(str(model))
        network.reshape({network.inputs[0].get_any_name(): [batch, *input_shape]})  # static: faster kernels
        # Synchronous single requests: the latency hint gives one request all cores. On bf16-capable
        # CPUs OpenVINO runs bf16 unless told f32, so fp32 is asked for explicitly.
        config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY"}
        if threads:  # this instance's share of the cores (one stream under the latency hint)
            config["INFERENCE_NUM_THREADS"] = threads
            # Unpinned: each compiled model pins its stream to the first cores, so two instances of one
            # thread each shared core 0 (Inception v3 fp32, 2-core AMD EPYC: 9.3 img/s pinned, 18.3 not).
            config["ENABLE_CPU_PINNING"] = False
        if precision in _OV_HINTS:
            config["INFERENCE_PRECISION_HINT"] = _OV_HINTS[precision]
        compiled = openvino_in_own_thread(core.compile_model, network, "CPU", config)  # see there: SIGSEGV
        actual = compiled.get_property("INFERENCE_PRECISION_HINT").to_string()  # "f32", "bf16", "f16"
        if precision in _OV_HINTS and actual != _OV_HINTS[precision]:
            raise Unsupported(f"OpenVINO would run {actual} when asked for {precision}: this CPU lacks {precision}")
        label = precision if precision in _OV_HINTS else f"int8 + {actual}"
        self.provider = f"OpenVINO {ov.__version__.split('-')[0]} CPU {label}"
        self.compiled = compiled
        self.request = compiled.create_infer_request()

    def place(self, inputs: np.ndarray) -> Any:
        import openvino as ov  # optional extra (openvino): imported on use, not at start-up

        return ov.Tensor(inputs)  # wraps the array: no copy

    def run(self, placed: Any) -> Any:
        self.request.infer({0: placed})
        return self.request.get_output_tensor(0)

    def to_numpy(self, output: Any) -> np.ndarray:
        return np.array(output.data, dtype=np.float32)


class OpenVinoRuntime(Runtime):
    name = "openvino"
    precisions = ("fp32", "bf16", "fp16", "int8")
    summary = "OpenVINO on the CPU (optional extra); int8 = NNCF post-training quantization"

    @classmethod
    def missing(cls) -> str | None:
        try:
            import openvino  # noqa: F401
        except ImportError:
            return "openvino is not installed: pip install 'inceptionlab[openvino]'"
        return None

    @classmethod
    def details(cls) -> str:
        import openvino as ov  # optional extra (openvino): imported on use, not at start-up

        core = ov.Core()
        return f"openvino {ov.__version__.split('-')[0]}; devices: {', '.join(core.available_devices)}"

    @classmethod
    def open(cls, artifacts: Artifacts, precision: str, layout: str, target: Target, batch: int) -> RuntimeSession:
        cls.require()
        cls.check_precision(precision)
        if target.device_type != "cpu":
            raise Unsupported("OpenVINO runs on the CPU here (--device cpu); use onnxruntime or eager on the GPU")
        model = artifacts.openvino_int8() if precision == "int8" else artifacts.onnx()
        return OpenVinoSession(model, precision, batch, artifacts.cache / "openvino", artifacts.source.spec.input_shape,
                               target.threads)


# --------------------------------------------------------------------------------------- registry

RUNTIMES: dict[str, type[Runtime]] = {
    runtime.name: runtime for runtime in (EagerRuntime, CompileRuntime, OnnxRuntime, OpenVinoRuntime)
}


def get_runtime(name: str) -> type[Runtime]:
    try:
        return RUNTIMES[name]
    except KeyError:
        raise UserError(f"--backend {name!r}: use one of {', '.join(RUNTIMES)}") from None


def auto_backend(device: str, input_kind: str) -> str:
    """`--backend auto` (serve, bench): on a CPU, OpenVINO when installed, else ONNX Runtime, else eager
    (measured on a 2-core AMD EPYC, Inception v3 299 px batch 8: OpenVINO bf16 fastest, then OpenVINO /
    ONNX Runtime fp32, then eager); on a GPU eager PyTorch (no compile wait at start-up); text: eager."""
    if input_kind != "image" or device != "cpu":
        return "eager"
    for name in ("openvino", "onnxruntime"):
        if get_runtime(name).missing() is None:
            return name
    return "eager"


def describe_runtimes() -> list[dict[str, Any]]:
    """What is usable here: each runtime's precisions, and its version/providers or why it is not."""
    rows = []
    for runtime in RUNTIMES.values():
        reason = runtime.missing()
        rows.append({"backend": runtime.name, "available": reason is None, "precisions": list(runtime.precisions),
                     "layouts": list(runtime.layouts), "summary": runtime.summary,
                     "details": reason or runtime.details()})
    return rows
