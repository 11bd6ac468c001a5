"""The batch size found on a GPU, tested with fake memory limits: a step that runs out of memory above a size."""

from __future__ import annotations

import pytest
import torch

from inceptionlab.config import load_recipe
from inceptionlab.engine import batch_size as finder
from inceptionlab.engine.speed import RunShape
from inceptionlab.errors import UserError

GIB = 2**30


def fake_gpu(limit_bytes: int, per_image: int, fixed: int = GIB):
    """A step whose peak is fixed + per_image x batch, raising CUDA's out-of-memory error past `limit_bytes`."""
    calls: list[int] = []

    def step_peak(batch: int) -> int:
        calls.append(batch)
        peak = fixed + per_image * batch
        if peak > limit_bytes:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {peak} bytes")
        return peak

    return step_peak, calls


def test_largest_batch_within_the_budget_by_doubling_then_bisection():
    """80 GiB card, 1 GiB fixed, 150 MiB per image: 545 images fit the hard limit; the budget (72 GiB, the
    free memory less 10%) allows 484; the answer is the largest tile of 8 below what bisection found."""
    step, calls = fake_gpu(80 * GIB, 150 * 2**20)
    probe = finder.find_batch(step, int(80 * GIB * 0.9))
    assert calls[:9] == [2, 4, 8, 16, 32, 64, 128, 256, 512]  # doubling until 512 is over the budget
    assert 256 < probe.fits <= 484 and probe.fails is not None and probe.fails - probe.fits <= probe.fits // 16 + 1
    assert probe.chosen == probe.fits - probe.fits % 8
    assert probe.peaks[512] == 1 * GIB + 512 * 150 * 2**20  # over the budget, not out of memory
    assert "fits in 72.0 GiB" in probe.evidence() and "peak per step" in probe.evidence()


def test_out_of_memory_is_the_answer_other_failures_raise():
    step, _ = fake_gpu(8 * GIB, GIB)  # 7 fit the hard limit
    probe = finder.find_batch(step, 100 * GIB)  # a budget that never binds: OOM decides
    assert probe.fits == 7 and probe.fails == 8 and probe.peaks[8] is None and probe.chosen == 7

    def broken(batch: int) -> int:
        raise RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR")

    with pytest.raises(RuntimeError, match="cuDNN"):
        finder.find_batch(broken, GIB)


def test_nothing_fits_is_a_clear_error():
    step, _ = fake_gpu(GIB // 2, GIB)
    probe = finder.find_batch(step, GIB)
    assert probe.chosen == 0
    recipe = load_recipe("demo/digits", ["train.batch_size=auto"])
    with pytest.raises(UserError, match="not even a batch of 1"):
        finder.resolve_batch_sizes(recipe, torch.nn.Linear(1, 1), None, torch.device("cuda"),
                                   RunShape((3, 80, 80), False, 10), probe=lambda *a: probe)


def shape() -> RunShape:
    return RunShape((3, 80, 80), False, 10)


def test_found_batch_scales_the_learning_rate_linearly():
    probe = finder.BatchProbe(96, 100, 112, 70 * GIB, {64: 40 * GIB, 128: None})
    recipe = load_recipe("demo/digits", ["train.batch_size=auto", "optim.lr=0.002", "optim.lr_batch_size=32"])
    resolved, notes = finder.resolve_batch_sizes(recipe, torch.nn.Linear(1, 1), None, torch.device("cuda"), shape(),
                                                 probe=lambda *a: probe)
    assert resolved.train.batch_size == 96 and resolved.optim.lr == pytest.approx(0.002 * 96 / 32)
    assert "0.002 x 96/32 = 0.006" in notes[0] and "128: out of memory" in notes[0]


def test_found_micro_batch_divides_the_batch_and_keeps_the_rate():
    probe = finder.BatchProbe(48, 50, 56, 70 * GIB)
    recipe = load_recipe("demo/digits", ["train.batch_size=256", "train.micro_batch_size=auto", "optim.lr=0.1"])
    resolved, notes = finder.resolve_batch_sizes(recipe, torch.nn.Linear(1, 1), None, torch.device("cuda"), shape(),
                                                 probe=lambda *a: probe)
    assert resolved.train.micro_batch_size == 32 and resolved.train.batch_size == 256  # 32 divides 256, <= 48
    assert resolved.optim.lr == 0.1 and "8 accumulated per step" in notes[0]


def test_on_a_cpu_auto_is_the_reference_batch_and_no_probe_runs():
    recipe = load_recipe("demo/digits", ["train.batch_size=auto", "train.micro_batch_size=auto", "optim.lr=0.01",
                                         "optim.lr_batch_size=64"])

    def never(*args):
        raise AssertionError("no probing on a CPU")

    resolved, notes = finder.resolve_batch_sizes(recipe, torch.nn.Linear(1, 1), None, torch.device("cpu"), shape(),
                                                 probe=never)
    assert resolved.train.batch_size == 64 and resolved.train.micro_batch_size is None
    assert resolved.optim.lr == pytest.approx(0.01) and "memory does not bound it" in notes[0]


def test_probe_figures_round_trip_through_the_speed_cache(tmp_path):
    from inceptionlab import hardware

    probe = finder.BatchProbe(96, 100, 112, 70 * GIB, {64: 40 * GIB, 128: None})
    cache = hardware.SpeedCache(tmp_path)
    key = hardware.make_key("batch", hardware.cpu_facts(), "resnet18", (3, 224, 224), 0, threads=1)
    cache.store(key, probe.to_figures())
    again = finder.BatchProbe.from_figures(cache.load(key))
    assert (again.chosen, again.fits, again.fails, again.peaks, again.source) == (96, 100, 112, probe.peaks, "cached")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_probing_a_real_gpu_finds_a_batch_that_trains_and_caches_it(tmp_path):
    """resnet18 at 64 px: the found batch runs a real training step within the budget, and the second
    call reads the cache instead of probing."""
    from inceptionlab import hardware
    from inceptionlab.engine.task import make_task
    from inceptionlab.models.registry import build_model

    device = torch.device("cuda")
    recipe = load_recipe("demo/digits", ["model.name=resnet18", "model.kwargs={}", "train.batch_size=auto",
                                         "train.precision=fp32", "train.channels_last=false", "train.compile=false"])
    model = build_model("resnet18", 10, None).model.to(device)
    task = make_task("multiclass", 10)
    cache = hardware.SpeedCache(tmp_path)
    probe = finder.probe_cuda(recipe, model, task, device, RunShape((3, 64, 64), False, 10), cache=cache)
    assert probe.chosen >= 16 and probe.source == "measured"
    assert probe.peaks[probe.fits] <= probe.budget_bytes
    again = finder.probe_cuda(recipe, model, task, device, RunShape((3, 64, 64), False, 10), cache=cache)
    assert again.source == "cached" and again.chosen == probe.chosen


def test_the_budget_leaves_room_for_what_the_run_places_after_probing():
    """The probe runs before the resident data cache, the weights' average (EMA) and DDP's gradient buckets
    exist: a budget of 90% of the free memory left them no room (a resident cache may take a quarter of it).
    The budget is the free memory less 10%, less those; the evidence names them; the cache keeps them."""
    reserved = {"the resident data": 3 * GIB, "the weights' average (EMA)": GIB // 2, "DDP's gradient buckets": 0}
    budget = finder.budget_bytes(80 * GIB, reserved)
    assert budget == int(80 * GIB * 0.9) - 3 * GIB - GIB // 2
    step, _ = fake_gpu(80 * GIB, 150 * 2**20)
    probe = finder.find_batch(step, budget)
    probe.reserved = reserved
    assert GIB + probe.fits * 150 * 2**20 <= budget
    assert "the free memory less 10% and 3.00 GiB for the resident data, 0.50 GiB for the weights' average (EMA)" \
        in probe.evidence() and "DDP" not in probe.evidence()
    assert finder.BatchProbe.from_figures(probe.to_figures()).reserved == reserved


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_a_session_probes_within_what_its_cache_and_average_leave(tmp_path, monkeypatch):
    """A session with EMA and a resident image folder on a GPU: the probe's budget is the free memory less
    10% less at least what the average and the resident images then take on the device."""
    from conftest import make_image_folder

    from inceptionlab.engine.session import build_training_session

    seen = {}
    real_find, real_free = finder.find_batch, torch.cuda.mem_get_info

    def find(step_peak, budget, **kwargs):
        seen["budget"] = budget
        return real_find(step_peak, budget, **kwargs)

    def free(device=None):
        seen.setdefault("free", real_free(device)[0])
        return real_free(device)

    monkeypatch.setattr(finder, "find_batch", find)
    monkeypatch.setattr(torch.cuda, "mem_get_info", free)
    data = make_image_folder(tmp_path / "data", train_per_class=40, val_per_class=10, size=64)
    recipe = load_recipe("inception_v3/imagefolder", [
        f"data.root={data}", "model.name=resnet18", "model.weights=null", "data.train_crop_size=64",
        "data.val_resize_size=64", "data.val_crop_size=64", "data.loader=resident", "data.num_workers=0",
        "train.batch_size=auto", "train.precision=fp32", "train.channels_last=false", "train.compile=false",
        "train.device=cuda", "ema.decay=0.99", "train.epochs=1"])
    s = build_training_session(recipe)
    average = sum(t.numel() * t.element_size() for t in s.ema.module.state_dict().values())
    images = sum(loader.images.numel() for loader in (s.train_loader, s.val_loader)
                 if loader.images.device.type == "cuda")
    assert images > 0  # the resident images went to the GPU, as the budget assumed
    assert seen["budget"] <= int(seen["free"] * 0.9) - average - images
