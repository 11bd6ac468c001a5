"""/dev/shm against what the guide's loop's DataLoader workers need."""

from __future__ import annotations

from inceptionlab.config import load_recipe
from inceptionlab.data.loading.sampler import default_num_workers
from inceptionlab.data.loading.shared_memory import MIB, shm_fix, shm_needed, workers_that_fit
from inceptionlab.data.loading.workers import PREFETCH
from inceptionlab.doctor.probes import SystemProbes
from inceptionlab.doctor.report import Check


def shm_check(probes: SystemProbes) -> Check:
    """Is /dev/shm big enough for the guide's loop's DataLoader workers (default count)?"""
    space = probes.shared_memory()
    if space is None:
        return Check("shm", "ok", "no /dev/shm here: DataLoader workers share memory another way")
    size, free = space
    guide = load_recipe("inception_v3/tiny_imagenet")
    # What a worker hands over on the guide's path: uint8 crops, 3 x crop x crop each.
    batch = guide.train.batch_size * 3 * guide.data.train_crop_size**2
    workers = default_num_workers()
    needed = shm_needed(workers, PREFETCH, batch)
    have = f"/dev/shm {size / MIB:.0f} MiB, {free / MIB:.0f} MiB free"
    loop = (f"the guide's loop ({workers} DataLoader workers x {PREFETCH} prefetched batches + 1, "
            f"{guide.train.batch_size} x 3 x {guide.data.train_crop_size}^2 uint8 = {batch / MIB:.1f} MiB each) "
            f"needs {needed / MIB:.0f} MiB")
    if free >= needed:
        return Check("shm", "ok", f"{have}: {loop}")
    fitting = workers_that_fit(workers, PREFETCH, batch, free)
    return Check("shm", "warn", (
        f"{have}, but {loop} (Docker's default is 64 MiB: too little gives 'bus error' in the workers); loaders "
        f"lower num_workers to what fits ({fitting} here) and say so; to keep them all: {shm_fix(needed)}"))
