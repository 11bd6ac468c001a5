"""DataLoader workers that fit in /dev/shm: fewer than asked, and said so, instead of a bus error.

A worker process hands each batch to the main process through shared memory (/dev/shm on Linux, torch's
default `file_descriptor` sharing strategy). A full pipeline holds `workers x prefetch_factor` batches
there plus the one the main process is using. Measured on a 2-core AMD EPYC, uint8 batches of
32 x 3 x 299 x 299 (8.6 MB), nothing consumed: 2 workers x prefetch 4 peaked at 77 MB of /dev/shm
(9.0 batches), 2 x 2 and 1 x 4 at 43 MB (5.0 batches); pinned memory changed nothing.

Docker gives a container 64 MiB of /dev/shm unless run with `--shm-size` or `--ipc=host`: the guide's
loop with 8 workers (33 batches, 270 MiB) dies there with "bus error" or "unable to write to file
</torch_...>". So every loader with workers asks `fit_workers` first: the most workers whose batches
fit in the space free at that moment (0 = load in the main process), with a warning naming the fix.
The batch size comes from one real sample (`batch_bytes`), so the estimate is that of this dataset.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from inceptionlab import host

log = logging.getLogger(__name__)

MIB = 2**20


def batches_in_flight(workers: int, prefetch: int) -> int:
    """Batches in shared memory when the pipeline is full (0 without workers: nothing is shared)."""
    return workers * prefetch + 1 if workers > 0 else 0


def shm_needed(workers: int, prefetch: int, batch_bytes: int) -> int:
    return batches_in_flight(workers, prefetch) * batch_bytes


def workers_that_fit(workers: int, prefetch: int, batch_bytes: int, free: int) -> int:
    """The most workers, at most `workers`, whose batches fit in `free` bytes (0: none does)."""
    fitting = workers
    while fitting > 0 and shm_needed(fitting, prefetch, batch_bytes) > free:
        fitting -= 1
    return fitting


def shm_fix(needed: int) -> str:
    """Docker's options that give workers room: at least twice what they need, in whole GiB."""
    gib = max(1, -(-2 * needed // 2**30))
    return f"`docker run --shm-size={gib}g` (or `--ipc=host`)"


def fit_workers(workers: int, prefetch: int, batch_bytes: int | None, *, what: str,
                space: Callable[[], tuple[int, int] | None] | None = None, sharers: int = 1) -> int:
    """`workers`, or fewer when /dev/shm has no room for their batches (logged as a warning).
    `space`: (size, free) of /dev/shm, host.shared_memory_space by default. `sharers`: processes on this
    node that load at the same time (torchrun's local world size); each sizes its workers for its share."""
    if workers <= 0 or not batch_bytes:
        return workers
    found = (space or host.shared_memory_space)()
    if found is None:
        return workers
    _, free = found
    free //= max(1, sharers)
    fitting = workers_that_fit(workers, prefetch, batch_bytes, free)
    if fitting < workers:
        needed = shm_needed(workers, prefetch, batch_bytes)
        log.warning(
            "%s: /dev/shm has %.0f MiB free%s, %d DataLoader worker(s) x %d prefetched batch(es) of %.1f MiB need "
            "%.0f MiB: using %d worker(s) instead; %s gives them room", what, free / MIB,
            f" for each of this node's {sharers} processes" if sharers > 1 else "", workers, prefetch,
            batch_bytes / MIB, needed / MIB, fitting, shm_fix(needed * max(1, sharers)))
    return fitting


def batch_bytes(dataset: Any, batch_size: int, tries: int = 4) -> int | None:
    """Bytes of one batch of `dataset`, from its first readable sample (None if none of the first
    `tries` is readable). The sample's random transforms draw on a forked RNG: the run's stays untouched."""
    with torch.random.fork_rng(devices=[]):
        for index in range(min(tries, len(dataset))):
            size = _tensor_bytes(dataset[index])
            if size:
                return size * batch_size
    return None


def _tensor_bytes(sample: Any) -> int:
    if isinstance(sample, torch.Tensor):
        return sample.numel() * sample.element_size()
    if isinstance(sample, (tuple, list)):
        return sum(_tensor_bytes(item) for item in sample)
    nbytes = getattr(sample, "nbytes", None)  # numpy arrays
    return int(nbytes) if isinstance(nbytes, int) else 0
