"""`bench` beside other processes: every row records their CPU use, a busy machine is said, configurations
take turns in rounds, rows whose rounds disagree are flagged, img/s comes from the median.

Deterministic: the runtimes are fakes whose calls take programmed times on an injected clock, and the
CPU samples (what the thread governor reads from /proc) are injected too. No busy loop, no timing assert.
"""

from __future__ import annotations


import pytest
from torch import nn

from inceptionlab import hardware
from inceptionlab.infer import bench
from inceptionlab.infer.bench import BenchSettings, Config, busy_warning, format_table, run_bench
from inceptionlab.infer.source import ModelSource
from inceptionlab.models.spec import ModelSpec

EAGER = Config("eager", "fp32", "nchw")
ORT = Config("onnxruntime", "fp32", "native")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeSession:
    """Each call advances the clock by the next of `durations_s` (cycled) and is logged by name."""

    def __init__(self, name: str, clock: Clock, durations_s: list[float], calls: list[str]):
        self.name, self.clock, self.durations, self.calls = name, clock, durations_s, calls
        self.provider = f"fake {name}"
        self.count = 0

    def place(self, inputs):
        return inputs

    def run(self, placed):
        self.clock.now += self.durations[self.count % len(self.durations)]
        self.count += 1
        self.calls.append(self.name)


class FakeRuntime:
    def __init__(self, make):
        self.make = make

    def open(self, artifacts, precision, layout, target, batch):
        return self.make()


@pytest.fixture
def source(tmp_path) -> ModelSource:
    spec = ModelSpec(arch="tiny", num_classes=2, class_names=["a", "b"], crop_size=8, resize_size=8)
    return ModelSource(nn.Sequential(nn.Flatten(), nn.Linear(192, 2)), spec, "tiny", "random", "0" * 64, tmp_path)


def fake_runtimes(monkeypatch, durations: dict[str, list[float]]) -> tuple[Clock, list[str]]:
    clock, calls = Clock(), []
    runtimes = {name: FakeRuntime(lambda name=name: FakeSession(name, clock, durations[name], calls))
                for name in durations}
    monkeypatch.setattr(bench, "get_runtime", lambda backend: runtimes[backend])
    return clock, calls


def cpu_samples(clock: Clock, others_cpus: float):
    """/proc's view as cpu_sample gives it: our own CPU time follows the clock (one busy thread), other
    processes' adds `others_cpus` CPUs' worth."""
    def sample() -> hardware.CpuSample:
        return hardware.CpuSample(busy=clock.now * (1 + others_cpus), own=clock.now, wall=clock.now)

    return sample


def measure(source, monkeypatch, durations, others_cpus=0.0, iters=20, rounds=4):
    clock, calls = fake_runtimes(monkeypatch, durations)
    settings = BenchSettings([1], iters=iters, warmup=1, rounds=rounds)
    configs = [EAGER, ORT]
    report = run_bench(source, configs, settings, clock=clock, sample=cpu_samples(clock, others_cpus))
    return report, calls


def test_rows_record_other_processes_cpu_use_and_a_busy_machine_says_so(source, monkeypatch):
    busy, _ = measure(source, monkeypatch, {"eager": [0.02], "onnxruntime": [0.004]}, others_cpus=1.0)
    assert [r["others_cpus"] for r in busy.rows] == [pytest.approx(1.0), pytest.approx(1.0)]
    assert busy.busy and all(r["machine_busy"] for r in busy.rows)
    warning = busy_warning(busy)
    assert "not quiet" in warning and "1.00 of" in warning and "rerun on a quiet machine" in warning
    quiet, _ = measure(source, monkeypatch, {"eager": [0.02], "onnxruntime": [0.004]}, others_cpus=0.01)
    assert not quiet.busy and busy_warning(quiet) is None
    assert [r["others_cpus"] for r in quiet.rows] == [pytest.approx(0.01), pytest.approx(0.01)]


def test_configurations_take_turns_in_rounds(source, monkeypatch):
    _, calls = measure(source, monkeypatch, {"eager": [0.02], "onnxruntime": [0.004]}, iters=20, rounds=4)
    timed = calls[4:]  # each session's first call and one warm-up call come first
    turns = [name for i, name in enumerate(timed) if i == 0 or timed[i - 1] != name]
    # 4 rounds, forward then backward: eager, ort | ort, eager | eager, ort | ort, eager (adjacent turns merge)
    assert turns == ["eager", "onnxruntime", "eager", "onnxruntime", "eager"]
    assert timed.count("eager") == timed.count("onnxruntime") == 20 + 4  # + one untimed call per turn


def test_rows_whose_rounds_disagree_are_flagged(source, monkeypatch):
    # eager slows down halfway (a neighbour starts): its rounds' medians differ by 100%; ONNX Runtime steady.
    steps = {"eager": [0.01] * 12 + [0.02] * 12, "onnxruntime": [0.004]}
    report, _ = measure(source, monkeypatch, steps, iters=20, rounds=4)
    eager, ort = report.rows
    assert eager["unsteady"] and eager["spread"] > bench.SPREAD_LIMIT
    assert not ort["unsteady"] and ort["spread"] == 0.0
    table = format_table(report.rows)
    assert any(line.startswith("eager") and "!" in line for line in table.splitlines())
    assert "img/s and speed-up from the median latency (p50)" in table


def test_img_per_s_comes_from_the_median(source, monkeypatch):
    # one call in ten is 10x slower: the mean moves, the median does not
    report, _ = measure(source, monkeypatch, {"eager": [0.01] * 9 + [0.1], "onnxruntime": [0.004]}, iters=20)
    eager = report.rows[0]
    assert eager["img_per_s"] == pytest.approx(1000 / eager["p50_ms"], rel=1e-3) == pytest.approx(100, rel=1e-3)
    assert eager["img_per_s_mean"] == pytest.approx(1000 / eager["mean_ms"], rel=1e-3)
    assert eager["img_per_s_mean"] < 80
    assert "img/s p50" in format_table(report.rows).splitlines()[0]


def test_round_sizes_split_iters_evenly():
    assert bench.round_sizes(20, 4) == [5, 5, 5, 5]
    assert bench.round_sizes(7, 3) == [3, 2, 2]
    assert bench.round_sizes(2, 5) == [1, 1]  # never an empty round
