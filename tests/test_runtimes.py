"""Runtimes: each one installed here runs on the CPU and agrees with eager fp32; providers are honest;
int8 quantization is judged by top-1 agreement on held-out real images."""

from __future__ import annotations

import ctypes
import gc
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from inceptionlab import hardware
import torch
from conftest import make_image_folder

from inceptionlab.errors import UserError
from inceptionlab.infer.inputs import random_inputs
from inceptionlab.infer.parity import torch_logits
from inceptionlab.infer.quantize import MIN_HOLDOUT_IMAGES, image_sets, judge
from inceptionlab.infer.runtimes import RUNTIMES, Artifacts, Target, Unsupported, choose_ort_provider, describe_runtimes
from inceptionlab.infer.source import ModelSource, load_source, state_checksum
from inceptionlab.models.registry import build_model
from inceptionlab.models.spec import ModelSpec

pytest.importorskip("onnxruntime")

GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")]


def tiny_artifacts(folder, seed: int) -> Artifacts:
    """The guide's CIFAR-10 CNN at 32 px (random weights, `seed`), its caches in `folder`."""
    torch.manual_seed(seed)
    model = build_model("cifar10_cnn", 10).model.eval()
    spec = ModelSpec("cifar10_cnn", 10, [str(i) for i in range(10)], crop_size=32, resize_size=32)
    return Artifacts(ModelSource(model, spec, "cifar10_cnn", "random", state_checksum(model), folder))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Artifacts:
    """The guide's CIFAR-10 CNN at 32 px (random weights, seed 0): every runtime opens it in seconds."""
    return tiny_artifacts(tmp_path_factory.mktemp("tiny"), 0)


def installed(backend: str) -> bool:
    return RUNTIMES[backend].missing() is None


CASES = [  # (backend, precision, layout, tolerance relative to the largest logit, what must run: a regex)
    ("eager", "fp32", "nchw", 1e-5, r"torch eager cpu fp32"),
    ("eager", "fp32", "channels_last", 1e-5, r"torch eager cpu fp32"),
    ("eager", "bf16", "channels_last", 3e-2, r"torch eager cpu autocast bf16"),  # bf16: 8 mantissa bits, ~0.4%/op
    ("onnxruntime", "fp32", "native", 1e-5, r"CPUExecutionProvider"),
    ("openvino", "fp32", "native", 1e-5, r"OpenVINO [0-9.]+ CPU fp32"),
    ("openvino", "bf16", "native", 3e-2, r"OpenVINO [0-9.]+ CPU bf16"),
]


@pytest.mark.parametrize("backend,precision,layout,rtol,provider", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_each_installed_runtime_runs_on_cpu_and_matches_eager_fp32(tiny, backend, precision, layout, rtol, provider):
    if not installed(backend):
        pytest.skip(f"{backend} not installed")
    if backend == "openvino" and precision == "bf16" and not hardware.cpu_facts().bf16:
        # OpenVINO refuses to emulate bf16 (eager does, slowly): the same probe `auto` asks decides.
        pytest.skip(f"this CPU has no bf16 units (hardware.cpu_facts: {hardware.cpu_facts().describe()})")
    session = RUNTIMES[backend].open(tiny, precision, layout, Target("cpu"), batch=2)
    inputs = random_inputs(5, (3, 32, 32))  # 5 = two full batches + one padded
    got = session.predict(inputs)
    want = torch_logits(tiny.source.model, inputs)
    assert got.shape == want.shape == (5, 10)
    assert np.abs(got - want).max() <= rtol * np.abs(want).max()
    placed = session.place(inputs[:2])
    assert session.to_numpy(session.run(placed)).shape == (2, 10)
    assert re.fullmatch(provider, session.provider), session.provider


def test_openvino_fp32_is_asked_for_explicitly(tiny):
    """On bf16-capable CPUs OpenVINO runs bf16 unless told f32: the fp32 row must really be f32."""
    if not installed("openvino"):
        pytest.skip("openvino not installed")
    session = RUNTIMES["openvino"].open(tiny, "fp32", "native", Target("cpu"), batch=1)
    assert session.provider.endswith("CPU fp32")


def test_openvino_instances_get_their_share_of_the_cores_unpinned(tiny):
    """An instance's threads are its share, and its stream is not pinned: pinned, two compiled models
    put their streams on the same first core and ran no faster together than one alone."""
    if not installed("openvino"):
        pytest.skip("openvino not installed")
    session = RUNTIMES["openvino"].open(tiny, "fp32", "native", Target("cpu", threads=1), batch=1)
    assert int(session.compiled.get_property("INFERENCE_NUM_THREADS")) == 1
    assert session.compiled.get_property("ENABLE_CPU_PINNING") is False
    whole = RUNTIMES["openvino"].open(tiny, "fp32", "native", Target("cpu"), batch=1)
    assert int(whole.compiled.get_property("INFERENCE_NUM_THREADS")) != 1 or hardware.usable_cpus() == 1


def test_unsupported_combinations_say_why(tiny):
    with pytest.raises(Unsupported, match="no int8 path"):
        RUNTIMES["eager"].open(tiny, "int8", "nchw", Target("cpu"), batch=1)
    with pytest.raises(Unsupported, match="no bf16"):
        RUNTIMES["onnxruntime"].open(tiny, "bf16", "native", Target("cpu"), batch=1)
    with pytest.raises(Unsupported, match="CPUExecutionProvider has no fp16"):
        RUNTIMES["onnxruntime"].open(tiny, "fp16", "native", Target("cpu"), batch=1)


def test_a_missing_provider_is_an_error_naming_what_is_installed():
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    with pytest.raises(UserError, match=r"no CUDAExecutionProvider here \(installed: .*CPUExecutionProvider.*"
                                        r"`pip uninstall -y onnxruntime && pip install onnxruntime-gpu`"):
        choose_ort_provider(Target("cuda", "cuda"))
    with pytest.raises(UserError, match="MIGraphXExecutionProvider.*pip install onnxruntime-migraphx -f AMD_WHEELS"):
        choose_ort_provider(Target("cuda", "migraphx"))
    with pytest.raises(UserError, match="removed its ROCm provider.*use --provider migraphx"):
        choose_ort_provider(Target("cuda", "rocm"))
    with pytest.raises(UserError, match="use auto or one of"):
        choose_ort_provider(Target("cpu", "coreml"))


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider' is not in available")
def test_a_silent_fallback_to_cpu_is_caught(tiny, monkeypatch):
    """ONNX Runtime quietly runs on the CPU when a GPU provider cannot load; that must not be timed."""
    import inceptionlab.infer.runtimes as runtimes

    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime really has the CUDA provider")
    monkeypatch.setattr(runtimes, "ort_installed_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(hardware, "device_facts", lambda device: hardware.gpu_facts_from("H100", "cuda", 9, 0))
    with pytest.raises(UserError, match="fell back from CUDAExecutionProvider to CPUExecutionProvider"):
        RUNTIMES["onnxruntime"].open(tiny, "fp32", "native", Target("cuda", "cuda"), batch=1)


class FakeOrt:
    """onnxruntime's surface as OrtSession uses it, recording which device each call names."""

    __version__ = "0.0-fake"

    def __init__(self):
        self.calls: list[tuple] = []
        fake = self

        class SessionOptions:
            pass

        class GraphOptimizationLevel:
            ORT_ENABLE_ALL, ORT_DISABLE_ALL = 99, 0

        class Binding:
            def bind_ortvalue_input(self, name, value):
                fake.calls.append(("input", name, value))

            def bind_output(self, name, device_type="cpu", device_id=0):
                fake.calls.append(("output", name, device_type, device_id))

            def get_outputs(self):
                return ["logits"]

        class InferenceSession:
            def __init__(self, path, options, providers):
                fake.calls.append(("providers", providers))
                self.providers = providers

            def get_providers(self):
                return [self.providers[0][0]]

            def io_binding(self):
                return Binding()

            def run_with_iobinding(self, binding):
                fake.calls.append(("run",))

        class OrtValue:
            @staticmethod
            def ortvalue_from_numpy(array, device_type="cpu", device_id=0):
                fake.calls.append(("place", device_type, device_id))
                return array

        self.SessionOptions, self.GraphOptimizationLevel = SessionOptions, GraphOptimizationLevel
        self.InferenceSession, self.OrtValue = InferenceSession, OrtValue


def test_onnxruntime_gpu_providers_run_on_the_devices_gpu_not_gpu_0(tiny, tmp_path, monkeypatch):
    """--device cuda:1: every provider's device_id, the input placed and the output bound on GPU 1."""
    import inceptionlab.infer.runtimes as runtimes

    monkeypatch.setattr(hardware, "device_facts", lambda device: hardware.gpu_facts_from("H100", "cuda", 9, 0))
    for name in ("cuda", "tensorrt", "migraphx"):
        options = runtimes.ORT_PROVIDERS[name].options("fp32", tmp_path, Target("cuda:1"), "images:2x3x32x32")
        assert options["device_id"] == "1", name
    cuda = runtimes.ORT_PROVIDERS["cuda"].options
    # cuDNN as PyTorch's rows get it on this GPU (hardware.backends): the autotuner, TF32 for fp32 only.
    assert cuda("fp32", tmp_path, Target("cuda:1"), "")["cudnn_conv_algo_search"] == "EXHAUSTIVE"
    assert (cuda("fp32", tmp_path, Target("cuda:1"), "")["use_tf32"], cuda("fp16", tmp_path, Target("cuda:1"), "")[
        "use_tf32"]) == ("1", "0")
    fake = FakeOrt()
    monkeypatch.setattr(runtimes, "import_onnxruntime", lambda: fake)
    monkeypatch.setattr(runtimes, "ort_installed_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    session = RUNTIMES["onnxruntime"].open(tiny, "fp32", "native", Target("cuda:1", "cuda"), batch=2)
    session.run(session.place(random_inputs(2, (3, 32, 32))))
    [(_, providers)] = [call for call in fake.calls if call[0] == "providers"]
    assert providers[0][0] == "CUDAExecutionProvider" and providers[0][1]["device_id"] == "1"
    assert ("place", "cuda", 1) in fake.calls and ("output", "logits", "cuda", 1) in fake.calls


def test_onnxruntime_reuses_its_optimized_graph_from_disk(tiny):
    cache = tiny.cache / "onnxruntime"
    RUNTIMES["onnxruntime"].open(tiny, "fp32", "native", Target("cpu"), batch=1)
    [optimized] = cache.glob("ort-optimized-*.onnx")
    stamp = optimized.stat().st_mtime_ns
    again = RUNTIMES["onnxruntime"].open(tiny, "fp32", "native", Target("cpu"), batch=4)
    assert optimized.stat().st_mtime_ns == stamp and len(list(cache.glob("*.onnx"))) == 1
    assert again.predict(random_inputs(4, (3, 32, 32))).shape == (4, 10)


@pytest.mark.slow  # two Inductor compiles: ~25 s on 2 cores
def test_each_compiled_model_keeps_its_own_inductor_cache_and_the_environment_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # as in a fresh process
    first, second = tiny_artifacts(tmp_path / "first", 0), tiny_artifacts(tmp_path / "second", 1)
    for artifacts in (first, second):
        session = RUNTIMES["compile"].open(artifacts, "fp32", "nchw", Target("cpu"), batch=2)
        # As every runtime in CASES: two full batches and a padded one, within 1e-4 of eager fp32 (Inductor
        # reorders the convolutions' sums). Checked here rather than in CASES: each compile costs ~25 s.
        inputs = random_inputs(5, (3, 32, 32))
        got, want = session.predict(inputs), torch_logits(artifacts.source.model, inputs)
        assert got.shape == want.shape == (5, 10)
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
        assert re.fullmatch(r"torch\.compile \(default, (dynamic|static) batch, inductor\) cpu fp32", session.provider)
    for artifacts in (first, second):
        assert [p for p in (artifacts.cache / "inductor").rglob("*.py") if p.is_file()], artifacts.cache
    # Not set to a model's cache for the rest of the process (torch may set its own default there).
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") not in {str(a.cache / "inductor") for a in (first, second)}


class CountingCompiles:
    """torch._inductor's compile_fx replaced by the graph as traced (no code generation: a second, not a
    minute), counting graphs and recording the config patches each was compiled with."""

    def __init__(self, monkeypatch):
        import torch._inductor.compile_fx as compile_fx

        self.graphs: list[tuple[int, ...]] = []
        self.patches: list[dict] = []
        monkeypatch.setattr(compile_fx, "compile_fx", self)

    def __call__(self, graph, example_inputs, config_patches=None):
        self.graphs.append(tuple(example_inputs[0].shape) if example_inputs else ())
        self.patches.append(dict(config_patches or {}))
        return graph.forward


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_one_compile_per_configuration_shared_by_every_session(tmp_path, monkeypatch, fresh_dynamo):
    """Instances, buckets, serving plans and the agreement check open sessions of one configuration:
    compiled once, not once per session (each compile used to add graphs until dynamo's limit)."""
    tiny = tiny_artifacts(tmp_path, 0)  # its own model: compiled configurations are kept per model
    compiled: list[object] = []
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: compiled.append(model) or real(model, **kwargs))
    counting = CountingCompiles(monkeypatch)
    # Dynamo also guards on torch's thread count: a plan's instances share one count, as here.
    sessions = [RUNTIMES["compile"].open(tiny, "fp32", "nchw", Target("cpu", threads=1), batch) for batch in (1, 4, 8)]
    for session in sessions:
        for batch in (1, 2, 4, 8):
            session.run(session.place(random_inputs(batch, (3, 32, 32))))
    assert len(compiled) == 1
    assert len(counting.graphs) <= 2  # batch 1, then one graph for every larger batch (dynamic batch)
    assert all(patch.get("freezing") is True for patch in counting.patches)  # per compile, not per call
    RUNTIMES["compile"].open(tiny, "bf16", "nchw", Target("cpu"), 4)
    assert len(compiled) == 2  # another precision is another configuration


def test_the_batch_dimension_is_compiled_as_hardware_decides(tmp_path, monkeypatch, fresh_dynamo):
    tiny = tiny_artifacts(tmp_path, 0)  # its own model: compiled configurations are kept per model
    counting = CountingCompiles(monkeypatch)
    monkeypatch.setattr(hardware, "compile_dynamic_batch", lambda facts: (False, "static, for this test"))
    session = RUNTIMES["compile"].open(tiny, "fp32", "channels_last", Target("cpu"), 4)
    for batch in (1, 2, 4):
        session.run(session.place(random_inputs(batch, (3, 32, 32))))
    assert len(counting.graphs) == 3 and "static batch" in session.provider  # a graph per batch size


def test_running_a_compiled_session_touches_no_process_wide_inductor_setting(tmp_path, monkeypatch, fresh_dynamo):
    """Sessions run in several threads: a config.patch around each call changed the setting for every
    thread at once (and an exit restored it under another thread's compile)."""
    tiny = tiny_artifacts(tmp_path, 0)  # its own model: compiled configurations are kept per model
    CountingCompiles(monkeypatch)
    session = RUNTIMES["compile"].open(tiny, "fp32", "nchw", Target("cpu"), 2)
    session.run(session.place(random_inputs(2, (3, 32, 32))))  # compiled here

    def patch(*args, **kwargs):
        raise AssertionError("a process-wide setting was patched at run time")

    monkeypatch.setattr(type(torch._inductor.config), "patch", patch)  # the class of every torch config module
    assert session.run(session.place(random_inputs(2, (3, 32, 32)))).shape == (2, 10)


def test_a_fallback_to_eager_is_said_and_shown_in_the_provider(tmp_path, monkeypatch, caplog, fresh_dynamo):
    tiny = tiny_artifacts(tmp_path, 0)  # its own model: compiled configurations are kept per model
    import inceptionlab.infer.runtimes as runtimes

    CountingCompiles(monkeypatch)
    monkeypatch.setattr(runtimes, "RECOMPILE_LIMIT", 1)  # one graph allowed: the second batch size falls back
    # torch without per-compile limits. Patched through torch's own config.patch: pytest's monkeypatch (9.2)
    # restores a module attribute by deleting it from the module's __dict__, and on torch's config modules a
    # delete hides the setting for the rest of the process (the next compile anywhere then fails).
    with torch._dynamo.config.patch(recompile_limit=1):
        session = RUNTIMES["compile"].open(tiny, "fp32", "nchw", Target("cpu"), 4)
        session.run(session.place(random_inputs(1, (3, 32, 32))))
        assert "fell back" not in session.provider
        with caplog.at_level("WARNING", logger="inceptionlab.infer.runtimes"):
            output = session.run(session.place(random_inputs(4, (3, 32, 32))))
    assert output.shape == (4, 10)  # eager still answers
    assert "fell back to eager" in session.provider
    assert any("fell back to eager" in record.getMessage() for record in caplog.records)


def signal_stack() -> tuple[int | None, int]:
    """This thread's alternate signal stack (sigaltstack): its address and size."""
    class StackT(ctypes.Structure):
        _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]

    current = StackT()
    assert ctypes.CDLL(None).sigaltstack(None, ctypes.byref(current)) == 0
    return current.ss_sp, current.ss_size


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sigaltstack is read through Linux's libc")
def test_openvino_models_freed_out_of_order_leave_this_threads_signal_stack_alone(tiny):
    """OpenVINO's CPU plugin swaps the compiling thread's signal stack and puts back what it found when
    the model is freed; freed out of order that left this thread on a freed stack, and the next
    signal handled here killed the process (SIGSEGV; docs/testing.md). Compiled in a thread of its own."""
    if not installed("openvino"):
        pytest.skip("openvino not installed")
    before = signal_stack()
    first = RUNTIMES["openvino"].open(tiny, "fp32", "native", Target("cpu"), batch=1)
    second = RUNTIMES["openvino"].open(tiny, "fp32", "native", Target("cpu"), batch=2)
    assert signal_stack() == before
    del first
    gc.collect()
    del second
    gc.collect()
    assert signal_stack() == before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OS thread names are read from Linux's /proc")
def test_openvinos_worker_threads_are_named_after_the_thread_that_compiled_them(tiny):
    """`top -H` and benchmarks/serve_cpu.py tell OpenVINO's workers from the server's threads by this name."""
    if not installed("openvino"):
        pytest.skip("openvino not installed")
    session = RUNTIMES["openvino"].open(tiny, "fp32", "native", Target("cpu"), batch=1)
    session.run(session.place(np.zeros((1, 3, 32, 32), np.float32)))
    # The compiling thread has ended: a live thread of that name is one the CPU plugin started.
    names = [(task / "comm").read_text().strip() for task in Path("/proc/self/task").iterdir()]
    assert "openvino_0" in names
    del session


def test_describe_runtimes_lists_every_backend_and_the_cpu_provider():
    rows = {r["backend"]: r for r in describe_runtimes()}
    assert set(rows) == {"eager", "compile", "onnxruntime", "openvino"}
    assert rows["eager"]["available"] and "CPUExecutionProvider" in rows["onnxruntime"]["details"]


# --------------------------------------------------------------------------------------- int8


@pytest.fixture(scope="module")
def trained(squares_run, tmp_path_factory):
    """resnet18 trained on coloured squares (a model with real margins) + 261 more such images."""
    pool = make_image_folder(tmp_path_factory.mktemp("int8") / "pool", train_per_class=0, val_per_class=87, seed=1)
    return load_source(run_dir=squares_run.run_dir), pool / "val"


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_int8_agreement_on_held_out_real_images(trained, backend):
    from inceptionlab.infer.inputs import image_files

    if not installed(backend):
        pytest.skip(f"{backend} not installed")
    source, pool = trained
    sets = image_sets(image_files([pool], source), source.spec, calibration=40, holdout=MIN_HOLDOUT_IMAGES)
    assert len(sets.calibration) == 40 and len(sets.holdout) == MIN_HOLDOUT_IMAGES
    artifacts = Artifacts(source, sets=sets)
    session = RUNTIMES[backend].open(artifacts, "int8", "native", Target("cpu"), batch=8)
    # ORT runs the QDQ graph on its CPU provider; OpenVINO names its int8 model and the float type around it.
    expected = r"CPUExecutionProvider" if backend == "onnxruntime" else r"OpenVINO [0-9.]+ CPU int8 \+ (f32|bf16)"
    assert re.fullmatch(expected, session.provider), session.provider
    inputs = sets.holdout_inputs()
    verdict = judge(torch_logits(source.model, inputs), session.predict(inputs))
    assert verdict.images == MIN_HOLDOUT_IMAGES
    assert verdict.agreement >= 0.99 and verdict.usable, verdict.reason
    # The quantized model is cached on disk: new Artifacts (a later command) reuse the file, not requantize.
    made = artifacts.onnx_int8 if backend == "onnxruntime" else artifacts.openvino_int8
    first = made()
    before = files_with_identity(source.cache)
    again = Artifacts(source, sets=sets)
    assert (again.onnx_int8 if backend == "onnxruntime" else again.openvino_int8)() == first
    assert files_with_identity(source.cache) == before  # same files, same inodes and times: nothing rewritten


def files_with_identity(folder) -> dict[str, tuple[int, int]]:
    """Every file below `folder`: (inode, mtime in ns). A rewrite or a new file changes it."""
    return {str(p.relative_to(folder)): (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def test_int8_is_quantized_for_real(trained):
    """The QDQ model holds int8 weights and uint8 activations, per channel (not a copy of fp32)."""
    import onnx

    from inceptionlab.infer.inputs import image_files

    source, pool = trained
    sets = image_sets(image_files([pool], source)[:30], source.spec, calibration=10, holdout=20)
    model = onnx.load(str(Artifacts(source, sets=sets).onnx_int8()))
    ops = {node.op_type for node in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    weight_types = {init.data_type for init in model.graph.initializer}
    assert onnx.TensorProto.INT8 in weight_types and onnx.TensorProto.UINT8 in weight_types


def test_agreement_rule():
    reference = np.eye(4)[np.arange(300) % 4] * 3.0
    same = reference.copy()
    assert judge(reference, same).usable
    two_flips = same.copy()
    two_flips[:4] = np.roll(two_flips[:4], 1, axis=1)  # 4 of 300 disagree: 98.7% < 99%
    verdict = judge(reference, two_flips)
    assert not verdict.usable and "98.7% < 99%" in verdict.reason
    small = judge(reference[:150], same[:150])
    assert small.agreement == 1.0 and not small.usable and "only 150 held-out images" in small.reason
    assert not judge(reference[:0], same[:0]).usable


# --------------------------------------------------------------------------------------- GPU


def gpu(test):
    for mark in reversed(GPU):
        test = mark(test)
    return test


@gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_eager_on_the_gpu_matches_the_cpu(tiny, precision):
    session = RUNTIMES["eager"].open(tiny, precision, "channels_last", Target("cuda"), batch=2)
    inputs = random_inputs(4, (3, 32, 32))
    want = torch_logits(tiny.source.model, inputs)
    assert np.abs(session.predict(inputs) - want).max() <= (1e-3 if precision == "fp32" else 2e-2) * np.abs(want).max()
    assert "cuda" in session.provider


@gpu
def test_onnxruntime_gpu_provider_really_runs_on_the_gpu(tiny):
    try:
        provider = choose_ort_provider(Target("cuda"))  # CUDA on NVIDIA builds, MIGraphX on ROCm builds
    except UserError as exc:
        pytest.skip(str(exc))
    session = RUNTIMES["onnxruntime"].open(tiny, "fp32", "native", Target("cuda"), batch=2)
    assert session.provider == provider.ep
    inputs = random_inputs(4, (3, 32, 32))
    want = torch_logits(tiny.source.model, inputs)
    assert np.abs(session.predict(inputs) - want).max() <= 1e-3 * np.abs(want).max()


@gpu
def test_onnxruntime_runs_on_the_last_gpu_when_asked(tiny):
    """--device cuda:N with N the last visible GPU (N > 0 on a multi-GPU host): ORT's device_id follows it."""
    last = f"cuda:{torch.cuda.device_count() - 1}"
    try:
        choose_ort_provider(Target(last))
    except UserError as exc:
        pytest.skip(str(exc))
    session = RUNTIMES["onnxruntime"].open(tiny, "fp32", "native", Target(last), batch=2)
    inputs = random_inputs(4, (3, 32, 32))
    want = torch_logits(tiny.source.model, inputs)
    assert np.abs(session.predict(inputs) - want).max() <= 1e-3 * np.abs(want).max()
    assert session.io_device_id == (torch.cuda.device_count() - 1 if session.io_device == "cuda" else 0)


@gpu
def test_compiled_serving_on_the_gpu_compiles_once_for_every_bucket_without_falling_back(tmp_path, fresh_dynamo):
    tiny = tiny_artifacts(tmp_path, 0)
    sessions = [RUNTIMES["compile"].open(tiny, "fp32", "channels_last", Target("cuda"), 8) for _ in range(2)]
    inputs = random_inputs(8, (3, 32, 32))
    want = torch_logits(tiny.source.model, inputs)
    for session in sessions:
        for batch in (1, 2, 4, 8):
            got = session.to_numpy(session.run(session.place(inputs[:batch])))
            assert np.abs(got - want[:batch]).max() <= 1e-2 * np.abs(want).max()
    assert sessions[0].compiled is sessions[1].compiled
    assert not sessions[0].compiled.fell_back and "fell back" not in sessions[1].provider


def test_dynamo_settings_survive_the_fallback_test():
    """The fallback test lowers dynamo's recompile limit for itself only: a later compile in the same worker
    still reads the setting (it once vanished, and the engine's compile test failed after it)."""
    assert torch._dynamo.config.recompile_limit >= 1
