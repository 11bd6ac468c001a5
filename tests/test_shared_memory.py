"""DataLoader workers sized to /dev/shm: a container's 64 MB gives fewer workers and a warning, not a bus error."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers.page_examples import check_example
from torch.utils.data import Dataset

from inceptionlab import host
from inceptionlab.data.loading.sampler import EpochSampler
from inceptionlab.data.loading.shared_memory import (batch_bytes, batches_in_flight, fit_workers, shm_needed,
                                                     workers_that_fit)
from inceptionlab.data.loading.workers import PREFETCH, worker_loader

MB = 10**6
GUIDE_BATCH = 32 * 3 * 299 * 299  # the guide's loop: 32 uint8 crops of 299 px, 8.58 MB
DOCKER_DEFAULT = (64 * 2**20, 64 * 2**20)


class Crops(Dataset):
    """Random uint8 crops the size of the guide's, drawn from the global RNG like RandomResizedCrop."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.randint(0, 256, (3, 299, 299), dtype=torch.uint8), index % 10


def test_a_full_pipeline_holds_workers_times_prefetch_batches_plus_the_one_in_use():
    assert batches_in_flight(2, 4) == 9  # measured: 77 MB of 8.6 MB batches = 9.0
    assert batches_in_flight(1, 4) == 5  # measured: 43 MB = 5.0
    assert batches_in_flight(0, 4) == 0  # no workers: nothing goes through shared memory
    assert shm_needed(8, 4, GUIDE_BATCH) == 33 * GUIDE_BATCH


@pytest.mark.parametrize(("free", "expected"), [(64 * 2**20, 1), (8 * 2**30, 8), (5 * MB, 0), (43 * MB, 1)])
def test_workers_that_fit(free, expected):
    assert workers_that_fit(8, 4, GUIDE_BATCH, free) == expected


def test_dockers_default_shm_lowers_the_workers_and_says_how_to_give_them_room(caplog):
    with caplog.at_level(logging.WARNING, logger="inceptionlab.data.loading.shared_memory"):
        workers = fit_workers(8, 4, GUIDE_BATCH, what="data loader", space=lambda: DOCKER_DEFAULT)

    assert workers == 1
    message = caplog.records[-1].getMessage()
    assert "/dev/shm has 64 MiB free" in message and "need 270 MiB" in message and "using 1 worker(s)" in message
    assert "docker run --shm-size=1g" in message and "--ipc=host" in message
    check_example("troubleshooting-shm-workers", message)


def test_room_enough_or_no_dev_shm_keeps_the_workers(caplog):
    with caplog.at_level(logging.WARNING):
        assert fit_workers(8, 4, GUIDE_BATCH, what="x", space=lambda: (2**34, 2**34)) == 8
        assert fit_workers(8, 4, GUIDE_BATCH, what="x", space=lambda: None) == 8  # macOS: no /dev/shm
        assert fit_workers(8, 4, None, what="x", space=lambda: DOCKER_DEFAULT) == 8  # size unknown
    assert not caplog.records


def test_batch_bytes_measures_a_real_sample_and_leaves_the_global_rng_alone():
    state = torch.get_rng_state()

    assert batch_bytes(Crops(), 32) == GUIDE_BATCH
    assert torch.equal(torch.get_rng_state(), state)


def test_batch_bytes_skips_unreadable_samples():
    class FirstUnreadable(Crops):
        def __getitem__(self, index):
            return (None, "broken.jpg") if index == 0 else super().__getitem__(index)

    assert batch_bytes(FirstUnreadable(), 2) == 2 * 3 * 299 * 299


def test_the_worker_loader_runs_with_the_workers_that_fit(monkeypatch, caplog):
    monkeypatch.setattr(host, "shared_memory_space", lambda path=host.SHARED_MEMORY: DOCKER_DEFAULT)
    sampler = EpochSampler(64, shuffle=True, seed=0)

    with caplog.at_level(logging.WARNING):
        loader = worker_loader(Crops(), sampler, batch_size=32, seed=0, num_workers=8)

    assert loader.loader.num_workers == workers_that_fit(8, PREFETCH, GUIDE_BATCH, DOCKER_DEFAULT[1]) == 1
    assert "using 1 worker(s)" in caplog.text
    inputs, targets = next(iter(loader))  # and it still delivers batches
    assert inputs.shape == (32, 3, 299, 299) and targets.shape == (32,)


def test_the_real_dev_shm_is_read_where_it_exists():
    space = host.shared_memory_space()
    if space is None:
        pytest.skip("this system has no /dev/shm (not Linux)")
    size, free = space
    assert 0 <= free <= size
