"""cuDNN's autotuner and TF32: one setting per device and precision (hardware.backends), applied alike by
training, evaluation, bench, serve and the inference calibration, and recorded in the environment.

On a CPU-only machine the GPU is simulated by its facts (an H100 from the tables): the settings are
process-wide torch flags, which torch lets any build set, so each command's effect is read back from
the flags while its model runs.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from inceptionlab import hardware
from inceptionlab.hardware import backends

SM90 = hardware.gpu_facts_from("NVIDIA H100", "cuda", 9, 0)
SM75 = hardware.gpu_facts_from("Tesla T4", "cuda", 7, 5)
GFX942 = hardware.gpu_facts_from("AMD Instinct MI300X", "rocm", gfx="gfx942")
CPU_FACTS = hardware.DeviceFacts("cpu", "a CPU", "AVX2", bf16=False, fp16=False)


@pytest.fixture
def flags_restored():
    """The process's flags as they were before the test, whatever it set."""
    saved = backends._read()
    yield
    backends._restore(saved)


@pytest.fixture
def h100(monkeypatch, flags_restored):
    """Every command asks the probe about its device and gets an H100."""
    monkeypatch.setattr(hardware, "device_facts", lambda device: SM90)


def tf32_now() -> bool:
    return backends.current().get("fp32_precision", [None])[0] == "tf32" or backends.current().get(
        "allow_tf32", [False])[0] is True


def test_one_setting_per_device_and_precision():
    assert backends.settings_for(SM90, "fp32") == backends.GpuSettings(cudnn_benchmark=True, tf32=True)
    assert backends.settings_for(SM90, "bf16") == backends.GpuSettings(True, False)  # bf16 matmuls: no TF32
    assert backends.settings_for(SM75, "fp32") == backends.GpuSettings(True, False)  # no TF32 before sm_80
    assert backends.settings_for(GFX942, "fp32") == backends.GpuSettings(False, False)  # MIOpen: no autotuner
    assert backends.settings_for(SM90, "fp32", deterministic=True) == backends.GpuSettings(False, False, True)
    assert backends.settings_for(CPU_FACTS, "fp32") is None
    record = backends.record(SM90)
    assert record["cudnn_benchmark"] and record["tf32"] == {"fp32": True, "bf16": False, "fp16": False}
    assert backends.record(CPU_FACTS) is None


@pytest.mark.skipif(not backends._has_fp32_precision_api(), reason="this torch has only the legacy TF32 flags")
def test_settings_use_the_fp32_precision_api_and_give_the_callers_flags_back(flags_restored):
    """Once the per-operator API is in use (PyTorch's own advice), reading a legacy allow_tf32 flag
    raises: the settings must not read or set them, and must restore exactly what was there."""
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    torch.backends.cudnn.benchmark = False
    before = backends.current()
    with hardware.gpu_settings(SM90, "fp32") as applied:
        assert applied == backends.GpuSettings(True, True)
        assert backends.current()["fp32_precision"] == ["tf32", "tf32", "tf32"]
        assert torch.backends.cudnn.benchmark
    with hardware.gpu_settings(SM90, "bf16"):
        assert backends.current()["fp32_precision"] == ["ieee", "ieee", "ieee"]
    assert backends.current() == before


def test_the_inference_calibration_times_each_candidate_with_its_precisions_settings(h100, tmp_path, monkeypatch):
    from inceptionlab.infer.speed import decide_inference

    monkeypatch.setenv("INCEPTIONLAB_AUTO", "measure")
    seen: list[tuple[bool, bool]] = []  # the flags while each candidate is timed, in the order timed
    monkeypatch.setattr(hardware, "time_steps",
                        lambda step, batch, seconds: seen.append((torch.backends.cudnn.benchmark, tf32_now())) or 1.0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(144, 2))
    decision = decide_inference(model, "small", (3, 8, 8), 2, torch.device("cpu"), cache=hardware.SpeedCache(tmp_path))
    assert {label.split()[0] for label in decision.candidates} == {"fp32", "bf16", "fp16"}
    assert dict(zip(decision.candidates, seen)) == {label: (True, label.startswith("fp32 "))
                                                    for label in decision.candidates}


def test_bench_runs_every_row_with_its_precisions_settings(h100, tmp_path, monkeypatch):
    import inceptionlab.infer.bench as bench
    from inceptionlab.infer.runtimes import Target
    from inceptionlab.infer.source import ModelSource, state_checksum
    from inceptionlab.models.registry import build_model
    from inceptionlab.models.spec import ModelSpec

    torch.manual_seed(0)
    model = build_model("cifar10_cnn", 10).model.eval()
    spec = ModelSpec("cifar10_cnn", 10, [str(i) for i in range(10)], crop_size=32, resize_size=32)
    source = ModelSource(model, spec, "cifar10_cnn", "random", state_checksum(model), tmp_path)
    turn = bench._one_turn  # the rows take turns in rounds: each turn must run under its row's settings
    seen: list[tuple[bool, bool]] = []
    monkeypatch.setattr(bench, "_one_turn", lambda *args: seen.append((torch.backends.cudnn.benchmark,
                                                                        tf32_now())) or turn(*args))
    torch.backends.cudnn.benchmark = False
    configs = [bench.Config("eager", "fp32", "nchw"), bench.Config("eager", "fp32", "channels_last")]
    bench.run_bench(source, configs, bench.BenchSettings([2], iters=2, warmup=1, target=Target("cpu")))
    assert seen == [(True, True)] * 4  # 2 rows x 2 rounds
    assert not torch.backends.cudnn.benchmark  # given back after the bench


def test_evaluation_runs_with_the_settings_training_validated_with(h100, monkeypatch):
    import inceptionlab.judge.evaluate as evaluate_module
    from inceptionlab.models.spec import ModelSpec

    seen: list[tuple[bool, bool]] = []

    def evaluate(model, loader, task, settings, **options):
        seen.append((torch.backends.cudnn.benchmark, tf32_now()))
        return {"loss": 0.0}

    monkeypatch.setattr(evaluate_module, "evaluate", evaluate)
    spec = ModelSpec("tiny", 2, ["a", "b"], crop_size=8, resize_size=8)
    dataset = [(torch.zeros(3, 8, 8, dtype=torch.uint8), 0)]
    evaluate_module.run_evaluation(torch.nn.Identity(), spec, dataset, device=torch.device("cpu"), batch_size=1,
                                   num_workers=0)
    assert seen == [(True, True)]


def test_a_served_model_runs_with_its_precisions_settings(h100, tmp_path_factory):
    from serve_helpers import serve_model, train_tiny_text_run

    run_dir = train_tiny_text_run(tmp_path_factory)
    torch.backends.cudnn.benchmark = False
    served = serve_model(run_dir)
    assert served.precision == "fp32" and torch.backends.cudnn.benchmark and tf32_now()


def test_the_environment_record_says_which_settings_each_precision_ran_with(h100):
    from inceptionlab.engine.artifacts import run_environment

    session = SimpleNamespace(device=torch.device("cpu"), dist=SimpleNamespace(world_size=1), speed=None,
                              recipe=SimpleNamespace(train=SimpleNamespace(deterministic=False)))
    env = run_environment(session)
    assert env["gpu_settings"] == backends.record(SM90)
    assert env["gpu_settings"]["tf32"]["fp32"] and not env["gpu_settings"]["tf32"]["bf16"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_on_this_gpu_the_cudnn_and_tf32_settings_take_effect_and_are_recorded(flags_restored):
    from inceptionlab.runtime import environment

    facts = hardware.device_facts("cuda")
    with hardware.gpu_settings(facts, "fp32") as applied:
        assert torch.backends.cudnn.benchmark == applied.cudnn_benchmark
        x = torch.randn(64, 64, device="cuda")
        assert np.isfinite((x @ x).sum().item())
    env = environment("cuda", gpu_settings=backends.record(facts))
    assert env["gpu_settings"]["cudnn_benchmark"] == (facts.kind == "cuda")
