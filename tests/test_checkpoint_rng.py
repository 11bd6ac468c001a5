"""A checkpoint saves and restores the RNG of the run's own device, never of every visible GPU.

The GPU side is simulated: `FakeCuda` stands in for torch.cuda's RNG calls with a given number of
devices, failing the way torch does when a state names a device that does not exist, and recording
whether anything would have initialised CUDA. The gpu-marked test checks the real thing.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from inceptionlab.checkpoint import ResumePoint, restore_training, rng_state, training_checkpoint

CPU = torch.device("cpu")


class FakeCuda:
    """torch.cuda's RNG surface for `count` devices, each with its own 16-byte state."""

    def __init__(self, count: int):
        self.count = count
        self.states = {i: torch.full((16,), i, dtype=torch.uint8) for i in range(count)}
        self.touched = False  # a call that initialises CUDA in torch (any get/set of a device's RNG)

    def _index(self, device) -> int:
        self.touched = True
        index = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        index = index.index if index.index is not None else 0
        if index >= self.count:  # what torch's lazy init raises for a device that is not there
            raise IndexError(f"device {index} of {self.count}")
        return index

    def get_rng_state(self, device="cuda"):
        return self.states[self._index(device)].clone()

    def set_rng_state(self, state, device="cuda"):
        self.states[self._index(device)] = state.clone()

    def get_rng_state_all(self):
        return [self.get_rng_state(i) for i in range(self.count)]

    def set_rng_state_all(self, states):
        for index, state in enumerate(states):
            self.set_rng_state(state, index)


@pytest.fixture
def fake_cuda(monkeypatch):
    def install(count: int) -> FakeCuda:
        fake = FakeCuda(count)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        for name in ("get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all"):
            monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
        return fake

    return install


def saved_on(gpus: int, device_index: int = 0) -> dict:
    """A checkpoint as f11b22f wrote it on a host with `gpus` GPUs: every GPU's state in a list."""
    state = rng_state()
    state["cuda"] = [torch.full((16,), 100 + i, dtype=torch.uint8) for i in range(gpus)]
    return {"class_names": ["a", "b"], "rng": state, "epoch": 1, "step_in_epoch": 0,
            "best": {"value": None, "epoch": None, "stale_epochs": 0}, "best_summary": None}


def test_an_eight_gpu_checkpoint_resumes_on_a_one_gpu_host(fake_cuda):
    fake = fake_cuda(1)
    restore_training(saved_on(8), {}, ["a", "b"], 0, device=torch.device("cuda", 0))
    assert torch.equal(fake.states[0], torch.full((16,), 100, dtype=torch.uint8))  # its own device's stream


def test_a_cpu_run_on_a_gpu_host_neither_saves_nor_restores_gpu_state(fake_cuda):
    fake = fake_cuda(2)
    state = rng_state(CPU)
    assert "cuda" not in state
    restore_training(saved_on(2), {}, ["a", "b"], 0, device=CPU)
    assert not fake.touched


def test_a_cpu_run_without_a_device_named_never_touches_cuda(fake_cuda):
    fake = fake_cuda(8)
    restore_training(saved_on(8), {}, ["a", "b"], 0)
    point = ResumePoint(1, 0, {"value": None, "epoch": None, "stale_epochs": 0}, None)
    ckpt = training_checkpoint({}, point, class_names=["a"], recipe={}, spec={})
    assert "cuda" not in ckpt["rng"] and not fake.touched


def test_a_gpu_run_saves_only_its_own_device_and_restores_it_on_another_index(fake_cuda):
    fake = fake_cuda(4)
    fake.states[2] = torch.full((16,), 42, dtype=torch.uint8)
    state = rng_state(torch.device("cuda", 2))
    assert torch.equal(state["cuda"], fake.states[2])  # one tensor: the run's device, not a list of 4
    fake.states[2] = torch.zeros(16, dtype=torch.uint8)
    fake = fake_cuda(1)  # resumed on a one-GPU host
    restore_training({**saved_on(1), "rng": state}, {}, ["a", "b"], 0, device=torch.device("cuda", 0))
    assert torch.equal(fake.states[0], torch.full((16,), 42, dtype=torch.uint8))


def test_cpu_streams_are_restored_whatever_the_gpu_state(fake_cuda):
    fake_cuda(1)
    ckpt = saved_on(8)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    ckpt["rng"]["torch"] = torch.get_rng_state()
    torch.rand(5)  # move the stream on
    restore_training(ckpt, {}, ["a", "b"], 0, device=torch.device("cuda", 0))
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_a_cpu_run_on_this_gpu_host_does_not_initialise_cuda():
    """In a fresh process (this one may have used the GPU already): a CPU checkpoint round trip."""
    code = textwrap.dedent("""
        import torch
        from inceptionlab.checkpoint import ResumePoint, restore_training, training_checkpoint
        point = ResumePoint(1, 0, {"value": None, "epoch": None, "stale_epochs": 0}, None)
        ckpt = training_checkpoint({}, point, class_names=["a"], recipe={}, spec={}, device=torch.device("cpu"))
        restore_training(ckpt, {}, ["a"], 0, device=torch.device("cpu"))
        print(torch.cuda.is_initialized())
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_resume_of_a_gpu_checkpoint_restores_the_devices_stream():
    device = torch.device("cuda", torch.cuda.device_count() - 1)
    torch.cuda.manual_seed(7)
    state = rng_state(device)
    expected = torch.rand(4, device=device)
    torch.rand(9, device=device)
    restore_training({**saved_on(0), "rng": state}, {}, ["a", "b"], 0, device=device)
    assert torch.equal(torch.rand(4, device=device), expected)
