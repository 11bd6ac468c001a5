"""inceptionlab.hardware: what `auto` decides, from fake probes and fake timings, and on this real host."""

from __future__ import annotations

from dataclasses import replace
import os
import time
from pathlib import Path

import pytest
import torch
from helpers.page_examples import check_example

from inceptionlab import hardware
from inceptionlab.errors import UserError
from inceptionlab.hardware import AUTO, Candidate, DeviceFacts, SpeedCache, Wanted

ZEN3 = DeviceFacts("cpu", "AMD EPYC (Zen 3)", "AVX2", bf16=False, fp16=False)
ZEN4 = DeviceFacts("cpu", "AMD EPYC (Zen 4)", "AVX512", bf16=True, fp16=False)
SM75 = hardware.gpu_facts_from("Tesla T4", "cuda", 7, 5)
SM90 = hardware.gpu_facts_from("NVIDIA H100", "cuda", 9, 0)
GFX1100 = hardware.gpu_facts_from("Radeon RX 7900 XTX", "rocm", gfx="gfx1100")
GFX90A = hardware.gpu_facts_from("AMD Instinct MI250X", "rocm", gfx="gfx90a:sramecc+:xnack-")
GFX942 = hardware.gpu_facts_from("AMD Instinct MI300X", "rocm", gfx="gfx942")


def fake_measure(speeds: dict[str, float], calls: list[str] | None = None):
    """A measurement that returns fixed images/s per candidate label (and records what it timed)."""

    def measure(candidate: Candidate, seconds: float) -> float | None:
        if calls is not None:
            calls.append(candidate.label)
        return speeds.get(candidate.label)

    return measure


def decide_for(facts: DeviceFacts, speeds: dict[str, float], wanted: Wanted = Wanted(compile=False), **kwargs):
    candidates, reasons = hardware.plan_candidates(facts, wanted, training=True, env={})
    return hardware.decide(candidates, fake_measure(speeds), ruled_out=reasons, **kwargs), candidates


# ------------------------------------------------------------------------------- the probe's tables


def test_a_cpu_without_bf16_units_never_gets_bf16_as_a_candidate():
    candidates, reasons = hardware.plan_candidates(ZEN3, Wanted(), training=True, env={})
    assert {c.precision for c in candidates} == {"fp32"}
    assert "emulated" in reasons["bf16"]
    decision, _ = decide_for(ZEN3, {"fp32 nchw": 55.1, "fp32 channels_last": 77.6})
    check_example("speed-settings-train-avx2", decision.line("speed settings"))


def test_gpu_tables_follow_the_architecture():
    assert (SM75.bf16, SM75.fp16, SM75.tf32) == (False, True, False)
    assert (SM90.bf16, SM90.fp16, SM90.tf32) == (True, True, True)
    assert GFX942.bf16 and GFX942.fp16
    assert GFX90A.arch == "gfx90a" and GFX90A.bf16 and not GFX90A.fp16  # MIOpen#3310: slow fp16 convs
    assert GFX1100.bf16 and GFX1100.kind == "rocm"
    old = hardware.gpu_facts_from("Tesla P100", "cuda", 6, 0)
    assert not (old.bf16 or old.fp16 or old.tf32)


def test_sm75_trains_in_fp16_with_a_scaler_when_it_measures_faster():
    decision, candidates = decide_for(SM75, {"fp32 nchw": 100, "fp16 nchw": 250, "fp32 channels_last": 110,
                                             "fp16 channels_last": 240})
    assert {c.precision for c in candidates} == {"fp32", "fp16"}  # no bf16 units before sm_80
    assert decision.choice == Candidate("fp16", False)


def test_bf16_gpus_train_in_bf16_not_fp16():
    candidates, _ = hardware.plan_candidates(SM90, Wanted(compile=False), training=True, env={})
    assert {c.precision for c in candidates} == {"fp32", "bf16"}


def test_inceptionlab_auto_safe_resolves_auto_to_the_safe_configuration_without_timing():
    candidates, reasons = hardware.plan_candidates(ZEN4, Wanted(precision=AUTO, channels_last=True), training=True,
                                                   env={"INCEPTIONLAB_AUTO": "safe"})
    assert candidates == [Candidate("fp32", True, False)]  # what was set stays set
    decision = hardware.decide(candidates, fake_measure({}), ruled_out=reasons)
    assert decision.source == "safe" and "INCEPTIONLAB_AUTO=safe" in decision.line()


def test_a_fake_gfx1100_keeps_nchw_unless_channels_last_measures_faster():
    slower_nhwc = {"fp32 nchw": 100, "fp32 channels_last": 40, "bf16 nchw": 150, "bf16 channels_last": 60}
    assert decide_for(GFX1100, slower_nhwc)[0].choice == Candidate("bf16", False)
    faster_nhwc = {"fp32 nchw": 100, "fp32 channels_last": 130, "bf16 nchw": 150, "bf16 channels_last": 190}
    assert decide_for(GFX1100, faster_nhwc)[0].choice == Candidate("bf16", True)


def test_the_users_miopen_nhwc_setting_decides_the_layout_on_rocm():
    candidates, reasons = hardware.plan_candidates(GFX942, Wanted(compile=False), training=True,
                                                   env={"PYTORCH_MIOPEN_SUGGEST_NHWC": "0"})
    assert {c.channels_last for c in candidates} == {False}
    assert "PYTORCH_MIOPEN_SUGGEST_NHWC" in reasons["layout"]


def test_compile_is_never_a_candidate_on_cpus_or_rocm_and_only_for_long_runs_on_nvidia():
    for facts in (ZEN4, GFX942):
        candidates, _ = hardware.plan_candidates(facts, Wanted(), training=True, long_run=True, env={})
        assert not any(c.compile for c in candidates)
    short, _ = hardware.plan_candidates(SM90, Wanted(), training=True, long_run=False, env={})
    long, _ = hardware.plan_candidates(SM90, Wanted(), training=True, long_run=True, env={})
    assert not any(c.compile for c in short) and any(c.compile for c in long)


# ------------------------------------------------------------------------------- the decision


def test_bf16_ten_times_slower_picks_fp32():
    decision, _ = decide_for(replace(ZEN4, name="a CPU whose bf16 is slow"),
                             {"fp32 nchw": 45, "fp32 channels_last": 52, "bf16 nchw": 4.5, "bf16 channels_last": 5.4})
    assert decision.choice == Candidate("fp32", True)


def test_bf16_twice_as_fast_picks_bf16():
    decision, _ = decide_for(ZEN4, {"fp32 nchw": 20, "fp32 channels_last": 19, "bf16 nchw": 23, "bf16 channels_last": 40})
    assert decision.choice == Candidate("bf16", True)
    assert decision.img_per_s["bf16 channels_last"] == 40
    assert "bf16 channels_last (measured" in decision.line()
    page, _ = decide_for(ZEN4, {"bf16 channels_last": 102.9, "bf16 nchw": 87.0, "fp32 channels_last": 74.6,
                                "fp32 nchw": 59.3})  # the page's figures: make demo on a Zen 4
    check_example("speed-settings-train-bf16", page.line("speed settings"))


def test_a_gain_inside_the_noise_keeps_the_safe_configuration():
    decision, _ = decide_for(ZEN4, {"fp32 nchw": 100, "fp32 channels_last": 105, "bf16 nchw": 90,
                                    "bf16 channels_last": 104})
    assert decision.choice == hardware.SAFE


def test_a_candidate_that_fails_is_dropped_never_chosen():
    def measure(candidate: Candidate, seconds: float) -> float | None:
        if candidate.precision == "bf16":
            raise RuntimeError("no kernel")
        return {"fp32 nchw": 10.0, "fp32 channels_last": 30.0}[candidate.label]

    candidates, _ = hardware.plan_candidates(ZEN4, Wanted(compile=False), training=True, env={})
    decision = hardware.decide(candidates, measure)
    assert decision.choice == Candidate("fp32", True)
    assert decision.ruled_out["bf16 nchw"].startswith("failed")


def test_an_explicit_setting_overrides_auto_and_only_auto_dimensions_are_searched():
    calls: list[str] = []
    candidates, _ = hardware.plan_candidates(ZEN4, Wanted(precision="fp32", compile=False), training=True, env={})
    decision = hardware.decide(candidates, fake_measure({"fp32 nchw": 10, "fp32 channels_last": 20}, calls))
    assert sorted(calls) == ["fp32 channels_last", "fp32 nchw"]
    assert decision.choice == Candidate("fp32", True)
    pinned, _ = hardware.plan_candidates(ZEN4, Wanted("bf16", True, False), training=True, env={})
    assert pinned == [Candidate("bf16", True)]
    assert hardware.decide(pinned, fake_measure({}, calls)).source == "pinned"
    assert len(calls) == 2  # a pinned choice times nothing


def test_the_calibration_shares_its_time_bound_among_the_candidates():
    shares: list[float] = []
    now = [0.0]

    def measure(candidate: Candidate, seconds: float) -> float:
        shares.append(seconds)
        now[0] += seconds  # each candidate uses its whole share
        return 10.0

    candidates = [Candidate("fp32", False), Candidate("fp32", True), Candidate("bf16", False), Candidate("bf16", True)]
    decision = hardware.decide(candidates, measure, budget_s=20.0, clock=lambda: now[0])
    assert shares == [5.0, 5.0, 5.0, 5.0]
    assert decision.seconds == pytest.approx(20.0)


def test_a_spent_calibration_budget_runs_nothing_more():
    """The bound holds once spent: later candidates are not run at all (the old share of zero still ran a
    warm-up and two timed steps each), and they are reported as not timed, never as failed."""
    now, calls = [0.0], []

    def measure(candidate: Candidate, seconds: float) -> float:
        calls.append(candidate.label)
        now[0] += 25.0  # one slow candidate uses the whole 20 s and more
        return 10.0

    candidates = [Candidate("fp32", False), Candidate("fp32", True), Candidate("bf16", False), Candidate("bf16", True)]
    decision = hardware.decide(candidates, measure, budget_s=20.0, clock=lambda: now[0])
    assert calls == ["fp32 nchw"] and decision.choice == hardware.SAFE
    assert decision.ruled_out["bf16 channels_last"].startswith("not timed: the calibration's 20 s were spent")


def test_time_steps_with_no_time_left_runs_nothing():
    ran: list[int] = []
    assert hardware.time_steps(lambda: ran.append(1), batch=8, seconds=0.0) is None
    assert ran == []


def test_compile_is_decided_by_the_probe_and_never_timed():
    """Timing torch.compile costs its own compile (minutes for Inception v3): the probe decides it, the
    candidates are timed eager, and the choice carries the probe's compile."""
    timed: list[Candidate] = []

    def measure(candidate: Candidate, seconds: float) -> float:
        timed.append(candidate)
        return {"fp32 nchw": 10.0, "fp32 channels_last": 30.0}.get(candidate.label, 5.0)

    candidates, reasons = hardware.plan_candidates(SM90, Wanted(), training=True, long_run=True, env={})
    decision = hardware.decide(candidates, measure, ruled_out=reasons)
    assert timed and not any(c.compile for c in timed)
    assert decision.choice == Candidate("fp32", True, compile=True) and "compile" not in " ".join(decision.img_per_s)
    pinned, _ = hardware.plan_candidates(ZEN4, Wanted(compile=True), training=True, env={})
    timed.clear()
    assert hardware.decide(pinned, measure).choice.compile and not any(c.compile for c in timed)


def test_a_baseline_that_runs_out_of_memory_is_never_chosen():
    """fp32 NCHW at a batch sized for bf16: the best candidate that ran is chosen, and the line says why."""
    def measure(candidate: Candidate, seconds: float) -> float | None:
        if candidate.precision == "fp32":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return {"bf16 nchw": 50.0, "bf16 channels_last": 80.0}[candidate.label]

    candidates, reasons = hardware.plan_candidates(SM90, Wanted(compile=False), training=True, env={})
    decision = hardware.decide(candidates, measure, ruled_out=reasons)
    assert decision.choice == Candidate("bf16", True)
    assert "fp32 nchw could not run (out of memory" in decision.line()
    assert decision.ruled_out["fp32 nchw"].startswith("out of memory")


def test_when_no_candidate_runs_the_error_says_why():
    def measure(candidate: Candidate, seconds: float) -> float | None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    candidates, reasons = hardware.plan_candidates(SM90, Wanted(compile=False), training=True, env={})
    with pytest.raises(UserError, match=r"no speed setting could run here \(fp32 nchw: out of memory"):
        hardware.decide(candidates, measure, ruled_out=reasons)


def test_memory_is_given_back_after_an_out_of_memory_candidate(monkeypatch):
    """The failed candidate's tensors are gone (its traceback released) before the cache is emptied."""
    import weakref

    held: list[weakref.ref] = []
    emptied: list[bool] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(held[0]() is None))

    def measure(candidate: Candidate, seconds: float) -> float | None:
        if candidate.precision == "bf16":
            activations = torch.zeros(1000)
            held.append(weakref.ref(activations))
            raise torch.OutOfMemoryError("CUDA out of memory")
        return 10.0

    hardware.decide([Candidate("fp32", False), Candidate("bf16", False)], measure)
    assert emptied == [True]


# ------------------------------------------------------------------------------- the cache


def _key(**changes) -> hardware.CacheKey:
    key = hardware.CacheKey("train", "cpu", "AMD EPYC", "AVX512", True, "2.14.1", "inception_v3", (3, 80, 80), 32, 2)
    return replace(key, **changes)


def test_a_cached_decision_is_reused_without_timing(tmp_path: Path):
    cache = SpeedCache(tmp_path)
    speeds = {"fp32 nchw": 20, "fp32 channels_last": 25, "bf16 nchw": 23, "bf16 channels_last": 40}
    first_calls: list[str] = []
    candidates, _ = hardware.plan_candidates(ZEN4, Wanted(compile=False), training=True, env={})
    first = hardware.decide(candidates, fake_measure(speeds, first_calls), key=_key(), cache=cache)
    again_calls: list[str] = []
    again = hardware.decide(candidates, fake_measure({}, again_calls), key=_key(), cache=cache)
    assert len(first_calls) == 4 and again_calls == []
    assert (first.source, again.source) == ("measured", "cached")
    assert again.choice == first.choice == Candidate("bf16", True)
    assert len(list(tmp_path.glob("train-*.json"))) == 1


def test_a_new_torch_version_or_device_measures_again(tmp_path: Path):
    cache = SpeedCache(tmp_path)
    candidates = [Candidate("fp32", False), Candidate("fp32", True)]
    hardware.decide(candidates, fake_measure({"fp32 nchw": 1, "fp32 channels_last": 2}), key=_key(), cache=cache)
    for changed in (_key(torch="2.15.0"), _key(device_name="Intel Xeon"), _key(arch="AVX2", bf16=False),
                    _key(batch=64), _key(threads=1)):
        calls: list[str] = []
        hardware.decide(candidates, fake_measure({"fp32 nchw": 1, "fp32 channels_last": 2}, calls), key=changed,
                        cache=cache)
        assert len(calls) == 2, changed


def test_fresh_measures_again_and_only_missing_candidates_are_timed(tmp_path: Path):
    cache = SpeedCache(tmp_path)
    fp32 = [Candidate("fp32", False), Candidate("fp32", True)]
    hardware.decide(fp32, fake_measure({"fp32 nchw": 1, "fp32 channels_last": 2}), key=_key(), cache=cache)
    calls: list[str] = []
    both = fp32 + [Candidate("bf16", True)]
    decision = hardware.decide(both, fake_measure({"bf16 channels_last": 5}, calls), key=_key(), cache=cache)
    assert calls == ["bf16 channels_last"] and decision.choice == Candidate("bf16", True)
    calls.clear()
    hardware.decide(both, fake_measure({"fp32 nchw": 1, "fp32 channels_last": 2, "bf16 channels_last": 5}, calls),
                    key=_key(), cache=cache, fresh=True)
    assert len(calls) == 3


def test_a_failed_candidate_is_cached_with_its_reason_so_auto_stays_the_same(tmp_path: Path):
    cache = SpeedCache(tmp_path)
    calls: list[str] = []

    def measure(candidate: Candidate, seconds: float) -> float | None:
        calls.append(candidate.label)
        if candidate.precision == "bf16":
            raise RuntimeError("no bf16 kernel for this convolution")
        return {"fp32 nchw": 10.0, "fp32 channels_last": 30.0}[candidate.label]

    candidates, _ = hardware.plan_candidates(ZEN4, Wanted(compile=False), training=True, env={})
    first = hardware.decide(candidates, measure, key=_key(), cache=cache)
    calls.clear()
    again = hardware.decide(candidates, measure, key=_key(), cache=cache)
    assert calls == [] and again.source == "cached" and again.choice == first.choice == Candidate("fp32", True)
    assert again.ruled_out["bf16 nchw"] == "failed: RuntimeError: no bf16 kernel for this convolution"
    hardware.decide(candidates, measure, key=_key(), cache=cache, fresh=True)
    assert len(calls) == 4  # --fresh (doctor --calibrate) tries the failed ones again


def test_an_unreadable_cache_file_is_measured_again(tmp_path: Path):
    cache = SpeedCache(tmp_path)
    cache.path(_key()).parent.mkdir(parents=True, exist_ok=True)
    cache.path(_key()).write_text("{ not json")
    assert cache.load(_key()) == {}


def test_the_cache_lives_in_the_users_cache_directory():
    assert hardware.cache_root({"XDG_CACHE_HOME": "/x/cache"}) == Path("/x/cache/inceptionlab")
    assert hardware.cache_root({"INCEPTIONLAB_CACHE": "/y"}) == Path("/y")
    assert hardware.cache_root({}) == Path.home() / ".cache" / "inceptionlab"


# ------------------------------------------------------------------------------- timing


def test_time_steps_excludes_the_warm_up_and_uses_the_median_step():
    now = [0.0]
    durations = iter([9.0, 1.0, 3.0, 1.0, 1.0, 1.0])  # warm-up 9 s (kernel search), then steps

    def step() -> None:
        now[0] += next(durations)

    assert hardware.time_steps(step, batch=10, seconds=100.0, clock=lambda: now[0]) == pytest.approx(10.0)


def test_time_steps_gives_up_on_a_candidate_whose_warm_up_exceeds_its_share():
    now = [0.0]

    def step() -> None:
        now[0] += 30.0

    assert hardware.time_steps(step, batch=8, seconds=5.0, clock=lambda: now[0]) is None


def test_a_warm_up_longer_than_its_share_is_not_a_verdict_the_step_after_it_is():
    """On an H200 (2026-12-04) each candidate's warm-up was cuDNN's kernel search, ~5-6 s for Inception v3 at
    batch 32, then ~40 ms steps: all four were called too slow and nothing was timed."""
    now = [0.0]
    durations = iter([6.0, 0.04, 0.04, 0.04])

    def step() -> None:
        now[0] += next(durations)

    assert hardware.time_steps(step, batch=32, seconds=5.0, clock=lambda: now[0]) == pytest.approx(800.0)
    slow = iter([6.0, 4.0, 4.0])  # a step after the warm-up still eats most of the share: too slow

    def slow_step() -> None:
        now[0] += next(slow)

    assert hardware.time_steps(slow_step, batch=32, seconds=5.0, clock=lambda: now[0]) is None


def test_a_calibration_that_timed_nothing_says_so_and_claims_no_measurement():
    candidates = [Candidate("fp32", False), Candidate("fp32", True), Candidate("bf16", False), Candidate("bf16", True)]
    decision = hardware.decide(candidates, fake_measure({}))  # every candidate: no figure
    assert decision.choice == hardware.SAFE and decision.img_per_s == {}
    assert "measured" not in decision.summary()
    assert "nothing could be timed" in decision.summary()


def test_on_a_gpu_the_calibration_budget_leaves_room_for_every_candidate_s_kernel_search():
    """Four candidates whose warm-ups (cuDNN's search) take 6 s each all get timed on a GPU; a CPU keeps 20 s."""
    now = [0.0]

    def measure(candidate: Candidate, seconds: float) -> float:
        now[0] += 6.1  # warm-up and two steps
        return {"fp32 nchw": 700.0, "fp32 channels_last": 760.0, "bf16 nchw": 1500.0}.get(candidate.label, 2100.0)

    candidates = [Candidate("fp32", False), Candidate("fp32", True), Candidate("bf16", False), Candidate("bf16", True)]
    decision = hardware.decide(candidates, measure, budget_s=hardware.calibration_budget(SM90), clock=lambda: now[0])
    assert decision.choice == Candidate("bf16", True) and len(decision.img_per_s) == 4
    assert hardware.calibration_budget(ZEN4) == hardware.CALIBRATION_BUDGET_S == 20.0


# ------------------------------------------------------------------------------- threads, MIOpen


def test_usable_cpus_follow_affinity_and_the_cgroup_quota(tmp_path: Path):
    assert hardware.usable_cpus(lambda: {0, 1, 2, 3}, lambda: None) == 4
    assert hardware.usable_cpus(lambda: {0, 1, 2, 3}, lambda: 1.5) == 2
    assert hardware.usable_cpus(lambda: {5}, lambda: 8.0) == 1
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert hardware.cgroup_cpu_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert hardware.cgroup_cpu_quota(tmp_path) is None


def test_miopen_caches_go_to_a_per_rocm_version_folder_unless_the_user_set_them(tmp_path: Path):
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    chosen = hardware.miopen_environment(env, "2.5.1+rocm6.2")
    assert chosen == {"MIOPEN_USER_DB_PATH": str(tmp_path / "inceptionlab/miopen/rocm6.2/db"),
                      "MIOPEN_CUSTOM_CACHE_DIR": str(tmp_path / "inceptionlab/miopen/rocm6.2/kernels")}
    assert hardware.miopen_environment({**env, "MIOPEN_USER_DB_PATH": "/mine"}, "2.5.1+rocm6.2") == {}
    assert hardware.miopen_environment(env, "2.14.1+cu130") == {}


def test_cudnn_benchmark_only_on_nvidia():
    assert hardware.cudnn_benchmark(SM90) and not hardware.cudnn_benchmark(GFX942)


# ------------------------------------------------------------------------------- this real host


def test_the_probe_agrees_with_onednn_on_this_host():
    facts = hardware.cpu_facts()
    assert facts.bf16 == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert facts.kind == "cpu" and facts.arch


def test_an_emulated_precision_is_announced_with_its_measured_slowdown():
    facts = hardware.cpu_facts()
    warning = hardware.emulation_warning(facts, "bf16")
    if facts.bf16:
        assert warning is None
    else:
        assert "emulated" in warning and "slower" in warning
    assert hardware.emulation_warning(replace(facts, bf16=False), "bf16", measure=False).startswith("bf16 is emulated")
    avx2 = replace(ZEN3, name="AMD EPYC")  # the page's host: measured here, on whatever this CPU is
    # as bench prints it (cli/bench.py), train's start-up notes and serve likewise
    check_example("speed-settings-bf16-emulated", f"warning: {hardware.emulation_warning(avx2, 'bf16')}")
    check_example("speed-settings-fp16-emulated", f"warning: {hardware.emulation_warning(avx2, 'fp16')}")


def test_fp16_on_a_cpu_without_fp16_units_is_announced_like_bf16():
    facts = hardware.cpu_facts()
    onednn = getattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", lambda: False)  # not in every torch
    assert facts.fp16 == bool(onednn())  # the probe asks oneDNN
    warning = hardware.emulation_warning(replace(facts, fp16=False), "fp16", measure=False)
    assert warning.startswith("fp16 is emulated on this CPU") and "slower than fp32" in warning
    assert hardware.emulation_warning(replace(facts, fp16=True), "fp16", measure=False) is None
    if not facts.fp16:
        measured = hardware.emulation_warning(facts, "fp16")
        assert "x slower than fp32 on one convolution here" in measured


def test_the_governor_gives_up_a_thread_while_another_process_keeps_a_cpu_busy():
    samples = iter([hardware.CpuSample(0, 0, 0), hardware.CpuSample(20, 10, 10),  # 1.0 CPU used by others
                    hardware.CpuSample(40, 20, 20),  # others again 1.0 CPU: unchanged
                    hardware.CpuSample(60, 40, 30)])  # others gone: back to 2
    set_to: list[int] = []
    lines: list[str] = []
    governor = hardware.ThreadGovernor(2, sample=lambda: next(samples), set_threads=set_to.append, say=lines.append,
                                       min_interval_s=0)
    assert [governor.update(), governor.update(), governor.update()] == [1, 1, 2]
    assert set_to == [2, 1, 2] and len(lines) == 2 and "other processes used 1.0 of 2 CPUs" in lines[0]
    check_example("speed-settings-threads", lines[0])


def test_the_governor_samples_at_most_every_min_interval():
    """Asked before every step, it reads /proc only when the last sample is old enough to mean something."""
    import time

    taken: list[float] = []

    def sample() -> hardware.CpuSample:
        taken.append(time.monotonic())
        return hardware.CpuSample(0, 0, time.monotonic())

    governor = hardware.ThreadGovernor(2, sample=sample, set_threads=lambda n: None, min_interval_s=3600)
    assert [governor.update() for _ in range(5)] == [2] * 5
    assert len(taken) == 1  # the first sample only, taken when the governor started
    governor.min_interval_s = 0.0
    governor.update()
    assert len(taken) == 2


def test_a_fixed_thread_count_is_never_governed():
    set_to: list[int] = []
    governor = hardware.ThreadGovernor(3, sample=lambda: hardware.CpuSample(0, 0, 0), set_threads=set_to.append,
                                       fixed=True)
    assert governor.update() == 3 and set_to == [3]
    assert hardware.thread_limit(None, {"OMP_NUM_THREADS": "1"}) == (1, True)
    assert hardware.thread_limit(4, {}) == (4, True)
    assert hardware.thread_limit(None, {})[1] is False


def test_cpu_samples_count_only_our_cpus_and_subtract_nothing_of_their_own(tmp_path: Path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  900 0 900 0 0 0 0 0 0 0\ncpu0 100 0 50 500 0 0 0 10 0 0\ncpu1 800 0 850 0 0 0 0 0 0 0\n")
    tick = os.sysconf("SC_CLK_TCK")
    sample = hardware.cpu_sample(cpus=[0], stat=stat)
    assert sample.busy == pytest.approx(160 / tick)


def test_our_own_cpu_time_is_counted_as_ours_never_as_other_load():
    before = hardware.cpu_sample()
    end = time.process_time() + 0.3
    while time.process_time() < end:  # burn 0.3 s of this process's CPU
        pass
    after = hardware.cpu_sample()
    assert after.own - before.own >= 0.3
    # The machine saw at least our own work as busy time on our CPUs (ticks are 10 ms).
    assert after.busy - before.busy >= 0.25


def test_without_a_measurement_the_cache_decides_else_the_probe(tmp_path: Path):
    cache = SpeedCache(tmp_path)
    candidates = [Candidate("fp32", False), Candidate("fp32", True)]
    probe_only = hardware.decide(candidates, None, key=_key(), cache=cache)
    assert probe_only.source == "probe" and probe_only.choice == hardware.SAFE and probe_only.img_per_s == {}
    hardware.decide(candidates, fake_measure({"fp32 nchw": 1, "fp32 channels_last": 2}), key=_key(), cache=cache)
    cached = hardware.decide(candidates, None, key=_key(), cache=cache)
    assert cached.source == "cached" and cached.choice == Candidate("fp32", True)


def small_cnn() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(8, 4))


def test_a_real_inference_calibration_is_bounded_honours_the_probe_and_is_reused(tmp_path: Path, monkeypatch):
    from inceptionlab.infer.speed import decide_inference

    monkeypatch.setenv("INCEPTIONLAB_AUTO", "measure")
    cache = SpeedCache(tmp_path)
    started = time.perf_counter()
    first = decide_inference(small_cnn(), "small", (3, 16, 16), 4, torch.device("cpu"), cache=cache)
    assert time.perf_counter() - started < 15  # INFERENCE_BUDGET_S, plus the warm-ups' slack
    assert first.source == "measured" and all(v > 0 for v in first.img_per_s.values())
    if not hardware.cpu_facts().bf16:  # emulated bf16 is never run, let alone chosen
        assert all(not label.startswith("bf16") for label in first.img_per_s) and first.choice.precision == "fp32"
    again = decide_inference(small_cnn(), "small", (3, 16, 16), 4, torch.device("cpu"), cache=cache)
    assert again.source == "cached" and again.choice == first.choice and again.img_per_s == first.img_per_s


def test_bench_auto_asks_each_runtime_for_the_precisions_this_device_has_units_for(monkeypatch):
    from inceptionlab.infer.bench import Config, plan

    monkeypatch.setenv("INCEPTIONLAB_AUTO", "measure")
    zen3 = plan(["eager", "onnxruntime"], ["auto"], ["auto"], ZEN3)
    assert {c.precision for c in zen3} == {"fp32"}  # no emulated bf16
    assert Config("eager", "fp32", "channels_last") in zen3 and Config("eager", "fp32", "nchw") == zen3[0]
    zen4 = plan(["eager", "onnxruntime"], ["auto"], ["nchw"], ZEN4)
    assert Config("eager", "bf16", "nchw") in zen4
    assert not any(c.backend == "onnxruntime" and c.precision == "bf16" for c in zen4)  # it has no bf16 path
    named = plan(["onnxruntime"], ["bf16"], ["nchw"], ZEN4)
    assert [c.precision for c in named] == ["bf16"]  # named: measured or reported skipped, never dropped
    monkeypatch.setenv("INCEPTIONLAB_AUTO", "safe")
    assert plan(["eager"], ["auto"], ["auto"], ZEN4) == [Config("eager", "fp32", "nchw")]


# ------------------------------------------------------------------------------- serving plans


def test_serve_plans_cover_instances_up_to_the_cpus_and_keep_what_the_user_set():
    assert [p.label for p in hardware.serve_plans(2, False, None, None)] == ["1x1", "1x32", "2x1", "2x32"]
    assert [p.label for p in hardware.serve_plans(16, False, None, 8)] == ["1x8", "2x8", "4x8"]
    assert [p.label for p in hardware.serve_plans(2, False, 2, None)] == ["2x1", "2x32"]
    assert [p.label for p in hardware.serve_plans(64, True, None, None)] == ["1x1", "1x32"]  # one GPU
    assert hardware.instance_threads(2, 2) == 1 and hardware.instance_threads(16, 3) == 5
    assert hardware.instance_threads(2, 4) == 1  # never zero


def test_a_serving_decision_is_cached_per_key(tmp_path: Path):
    cache = SpeedCache(tmp_path)
    plans = hardware.serve_plans(2, False, None, None)
    key = _key(purpose="serve", extra="openvino/fp32")
    calls: list[str] = []

    def measure(plan, seconds):
        calls.append(plan.label)
        return {"1x1": 20.0, "1x32": 60.0, "2x1": 30.0, "2x32": 50.0}[plan.label]

    first = hardware.decide_serving(plans, measure, cpus=2, gpu=False, key=key, cache=cache)
    again = hardware.decide_serving(plans, measure, cpus=2, gpu=False, key=key, cache=cache)
    assert len(calls) == 4 and again.source == "cached" and again.plan == first.plan


def test_the_cli_points_miopen_at_a_writable_per_version_folder_before_torch_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware.miopen, "rocm_build_tag", lambda version=None: "rocm6.4")
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    chosen = hardware.prepare_process_environment(env)
    assert env["MIOPEN_USER_DB_PATH"] == chosen["MIOPEN_USER_DB_PATH"] == str(tmp_path / "inceptionlab/miopen/rocm6.4/db")
    assert Path(env["MIOPEN_CUSTOM_CACHE_DIR"]).is_dir() and Path(env["MIOPEN_USER_DB_PATH"]).is_dir()
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o500)
    if os.access(read_only, os.W_OK):  # root writes anywhere: the unwritable branch cannot be shown here
        return
    assert hardware.prepare_process_environment({"XDG_CACHE_HOME": str(read_only)}) == {}


def test_training_asks_the_governor_before_every_step():
    from inceptionlab.engine.fit import _governed

    class Counting:
        calls = 0

        def update(self) -> int:
            self.calls += 1
            return 1

    governor = Counting()
    seen = []
    for batch in _governed(iter(range(4)), governor):
        seen.append((batch, governor.calls))
    assert seen == [(0, 1), (1, 2), (2, 3), (3, 4)]  # each step runs after its own check
    assert list(_governed(iter("ab"), None)) == ["a", "b"]


def test_a_deterministic_run_keeps_its_thread_count(monkeypatch):
    """train.deterministic asks for the same numbers run after run: a thread count that follows other
    processes' load changes how each reduction is split, so two runs of one recipe trained different
    weights (seen: the resident and worker loaders' runs differed after `threads: 2 -> 1` in one)."""
    from inceptionlab.engine.distributed import DistInfo
    from inceptionlab.engine.session import start_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # `make test` sets it, which fixes the count anyway
    single = DistInfo()
    assert start_threads(None, single, torch.device("cpu"), deterministic=True).fixed
    assert not start_threads(None, single, torch.device("cpu"), deterministic=False).fixed
