"""The training run's calibration: compile is never timed, and the device's memory is given back before
the run's own model and resident data are placed."""

from __future__ import annotations

import pytest
import torch

from inceptionlab import hardware
from inceptionlab.engine.choices import load_training_recipe
from inceptionlab.engine.speed import RunShape, decide_training, resolve_speed_settings
from inceptionlab.engine.task import make_task
from inceptionlab.models.registry import build_model


def small_cnn_run(*overrides: str):
    recipe = load_training_recipe("cifar10/small_cnn", ["model.weights=null", *overrides])
    model = build_model(recipe.model.name, 10, None, None).model
    task = make_task(recipe.task, 10, recipe.train.label_smoothing, None)
    return recipe, model, task, RunShape((3, 32, 32), False, 10)


def test_a_training_calibration_with_compile_set_times_eager_and_compiles_nothing(monkeypatch, tmp_path):
    """train.compile=true with precision and layout on auto: each candidate used to be compiled (minutes
    each for Inception v3, and recompiles that pushed the run's own compile past dynamo's limit)."""
    monkeypatch.setenv("INCEPTIONLAB_AUTO", "measure")
    compiled: list[object] = []

    def compile_spy(model, *args, **kwargs):
        compiled.append(model)
        raise RuntimeError("the calibration must not compile")

    monkeypatch.setattr(torch, "compile", compile_spy)
    recipe, model, task, shape = small_cnn_run("train.compile=true", "train.batch_size=4")
    decision = decide_training(recipe, model, task, torch.device("cpu"), shape, hardware.cpu_facts(),
                               cache=hardware.SpeedCache(tmp_path))
    assert compiled == []
    assert decision.source == "measured" and set(decision.img_per_s) == set(decision.candidates)
    assert decision.choice.compile  # as set: the run compiles its own model once


def test_the_calibrations_memory_goes_back_to_the_gpu_before_the_run_places_its_own(monkeypatch):
    emptied: list[bool] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    monkeypatch.setattr(hardware, "device_facts", lambda device: hardware.gpu_facts_from("H100", "cuda", 9, 0))
    monkeypatch.setattr("inceptionlab.engine.speed.decide_training",
                        lambda *args, **kwargs: hardware.Decision(hardware.SAFE))
    recipe, model, task, shape = small_cnn_run()
    resolved, decision = resolve_speed_settings(recipe, model, task, torch.device("cuda", 0), shape)
    assert emptied == [True] and decision.choice == hardware.SAFE
    emptied.clear()
    resolve_speed_settings(recipe, model, task, torch.device("cpu"), shape)
    assert emptied == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_on_this_gpu_the_calibration_is_bounded_compiles_nothing_and_gives_its_memory_back(monkeypatch, tmp_path):
    import time

    monkeypatch.setenv("INCEPTIONLAB_AUTO", "measure")
    compiled: list[object] = []
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, *a, **k: compiled.append(model) or real(model, *a, **k))
    device = torch.device("cuda", 0)
    recipe, model, task, shape = small_cnn_run("train.compile=true", "train.batch_size=64")
    baseline = torch.cuda.memory_reserved(device)
    started = time.perf_counter()
    resolved, decision = resolve_speed_settings(recipe, model, task, device, shape, fresh=True)
    assert time.perf_counter() - started < hardware.GPU_CALIBRATION_BUDGET_S + 30  # budget + warm-ups and set-up
    assert compiled == [] and decision.choice.compile and decision.source == "measured"
    assert torch.cuda.memory_reserved(device) <= baseline + 64 * 2**20  # the candidates' blocks given back
