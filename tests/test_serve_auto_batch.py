"""`serve --instances auto --max-batch auto --max-delay-ms auto`: the serving plan measured at start-up.

hardware.decide_serving's rule is tested with fake figures in test_hardware.py; here the server's side:
every instance's sessions get its share of the CPUs, the plans are timed concurrently as served, the
decision is cached per machine, and INCEPTIONLAB_AUTO=safe times nothing.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from inceptionlab import hardware
from inceptionlab.serve.models import EngineOpener, ModelLoadSettings, decide_plan, saturation


class RecordingSession:
    """Runs a small real computation; remembers the thread share it was opened with."""

    provider = "fake"

    def __init__(self, batch: int, threads: int | None, opened: list):
        self.batch, self.threads = batch, threads
        opened.append((batch, threads))
        self.running: set[int] = set()

    def place(self, inputs):
        return inputs

    def run(self, inputs):
        return np.tanh(inputs.reshape(len(inputs), -1) @ np.ones((inputs[0].size, 2), np.float32))

    def to_numpy(self, outputs):
        return outputs


def fake_opener(opened: list, active: list | None = None) -> EngineOpener:
    def open_session(batch, threads):
        session = RecordingSession(batch, threads, opened)
        if active is not None:  # count how many instances run at the same moment
            inner = session.run

            def run(inputs):
                with lock:
                    active.append(threading.get_ident())
                return inner(inputs)

            session.run = run
        return session

    lock = threading.Lock()
    from inceptionlab.models.spec import ModelSpec

    spec = ModelSpec(arch="fake", num_classes=2, class_names=["a", "b"], crop_size=8, resize_size=8)
    return EngineOpener("fake", spec, "eager", "fp32", open_session, True, [3, 8, 8])


def test_each_instance_gets_its_share_of_the_cpus_and_all_run_at_once():
    opened: list = []
    active: list = []
    figure = saturation(fake_opener(opened, active), hardware.ServePlan(2, 4), cpus=2, gpu=False, seconds=1.5)
    assert figure > 0
    assert opened == [(4, 1), (4, 1)]  # 2 instances x 1 thread: never more threads than CPUs
    workers = set(active) - {threading.get_ident()}  # the warm-up runs in the calling thread
    assert len(workers) == 2  # both instances' worker threads ran batches


def test_a_gpu_plan_leaves_threads_to_the_runtime():
    opened: list = []
    saturation(fake_opener(opened), hardware.ServePlan(1, 2), cpus=8, gpu=True, seconds=1.5)
    assert opened == [(2, None)]


def test_the_plan_is_measured_once_per_machine_then_recalled(monkeypatch, tmp_path):
    monkeypatch.setenv("INCEPTIONLAB_AUTO", "measure")
    monkeypatch.setenv("INCEPTIONLAB_CACHE", str(tmp_path))
    opened: list = []
    settings = ModelLoadSettings(log=lambda line: None)
    first = decide_plan(fake_opener(opened), settings)
    cpus = hardware.usable_cpus()
    assert first.source == "measured" and "1x1" in first.img_per_s
    assert len(first.img_per_s) == len(hardware.serve_plans(cpus, False, None, None))
    count = len(opened)
    again = decide_plan(fake_opener(opened), settings)
    assert again.source == "cached" and again.plan == first.plan and len(opened) == count  # nothing opened
    assert decide_plan(fake_opener(opened), ModelLoadSettings(fresh=True)).source == "measured"


def test_set_values_are_kept_and_safe_mode_times_nothing(monkeypatch):
    opened: list = []
    monkeypatch.setenv("INCEPTIONLAB_AUTO", "safe")
    decision = decide_plan(fake_opener(opened), ModelLoadSettings(max_batch=8))
    assert decision.plan == hardware.ServePlan(1, 8) and decision.max_delay_ms == 2.0 and opened == []
    decision = decide_plan(fake_opener(opened), ModelLoadSettings())
    assert decision.plan == hardware.ServePlan(1, 1) and decision.max_delay_ms == 0.0


@pytest.mark.parametrize("value, expected", [("auto", None), ("0", 0.0), ("2.5", 2.5)])
def test_max_delay_option_parses(value, expected):
    from inceptionlab.cli.serve import _delay

    assert _delay(value) == expected


def test_a_bad_max_delay_or_instance_count_is_a_one_line_error(cli):
    """Said before the ports are tried: a bad value is the error whether or not the ports are free (the
    gRPC port 8001 taken by another server on the machine hid it behind a port error)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = str(taken.getsockname()[1])
        for option, value in (("--max-delay-ms", "-1"), ("--max-delay-ms", "soon"), ("--instances", "0"),
                              ("--max-batch", "0"), ("--tta", "sideways")):
            result = cli("serve", "--model", "inception_v3", "--port", busy, "--grpc-port", busy, option, value)
            assert result.code == 2 and option in result.err and "cannot listen" not in result.err, result.err
            assert len(result.err.strip().splitlines()) == 1


def test_the_host_work_of_a_request_is_measured_as_cpu_time_on_the_sample_picture_or_a_text(monkeypatch):
    """What the plan charges against the cores per request: an image model's upload decoded and transformed
    (the package's sample picture; a generated photo without one), a text model's long text tokenized."""
    from inceptionlab.serve import models

    image = models.host_work(fake_opener([]))
    assert 0 < image.seconds < 1 and image.sample.startswith("a ") and "decoded and transformed" in image.sample
    monkeypatch.setattr(models, "sample_image_files", lambda: [])
    generated = models.host_work(fake_opener([]))
    assert generated.seconds > 0 and generated.sample.startswith("a 640x480 JPEG")

    class Vectorizer:
        def __init__(self):
            self.texts = []

        def encode(self, texts):
            self.texts += texts
            return np.zeros((len(texts), 8), np.int64)

    opener = fake_opener([])
    opener.vectorizer = Vectorizer()
    text = models.host_work(opener)
    assert text.seconds >= 0 and "text tokenized" in text.sample
    assert len(opener.vectorizer.texts) == models.HOST_RUNS + 1 and opener.vectorizer.texts[0] == models.SAMPLE_TEXT


def test_a_measured_plan_gives_the_served_model_its_batching_rule(monkeypatch, tmp_path):
    monkeypatch.setenv("INCEPTIONLAB_AUTO", "measure")
    monkeypatch.setenv("INCEPTIONLAB_CACHE", str(tmp_path))
    decision = decide_plan(fake_opener([]), ModelLoadSettings(instances=1, max_batch=4))
    assert decision.plan == hardware.ServePlan(1, 4) and decision.host is not None
    assert decision.rule.max_batch == 4 and decision.rule.max_delay_s == decision.max_delay_ms / 1e3
    assert set(decision.img_per_s) == {"1x1", "1x4"}  # the pinned plan and its batch-1 twin: its rule's curve
    assert "host work" in decision.line() and "1x4" in decision.latency
