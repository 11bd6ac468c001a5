"""A dynamic batcher under Poisson arrivals, simulated: the latency a serving plan gives at a request rate.

`serve` picks its plan (instances x max batch, hardware.decide_serving) for the highest rate of random
arrivals that still holds a latency objective, since that is what a server is for; a closed loop at
saturation (the figure measured at start-up) favours big batches that random arrivals rarely fill.
Timing every plan under Poisson load at start-up would take minutes for a slow model (a p99 needs
hundreds of requests per rate); instead each plan's batch times are measured once (batch 1 and its
largest batch, with all its instances running: `BatchTimes`) and the queue is simulated here, with
the batcher's own rule (serve/batcher.py): a batch starts when `max_batch` items wait or the oldest
has waited `max_delay`, whichever comes first, on the first free instance, and runs padded up to
the next bucket (1, 2, 4, ... max_batch).

What the simulation leaves out is the same for every plan: the front end's own work per request
(HTTP, decoding), and that idle instances would run faster than measured with all of them busy.
Pure Python and numpy, no torch: ~10 ms per simulated rate.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass

import numpy as np

ARRIVALS = 5000  # per simulated rate: ~50 requests above a p99, from the same seeded draw at every rate
QUANTILE = 99.0
LONE = 1e-6  # requests/s at which every request meets an empty server
MAX_BISECTIONS = 30


@dataclass(frozen=True)
class BatchTimes:
    """Seconds one instance takes for a batch of 1 and of `max_batch` items while every instance of the
    plan runs; a batch in between is padded to its bucket, and its time is interpolated linearly."""

    single: float
    full: float
    max_batch: int

    def of(self, items: int) -> float:
        bucket = min(self.max_batch, 1 << max(0, items - 1).bit_length())
        if self.max_batch == 1:
            return self.single
        return self.single + (self.full - self.single) * (bucket - 1) / (self.max_batch - 1)

    @property
    def capacity(self) -> float:
        """Items per second of one instance running full batches back to back."""
        return self.max_batch / self.full


def poisson_arrivals(rate: float, count: int = ARRIVALS, seed: int = 0) -> list[float]:
    """Arrival times (s) of `count` requests at `rate`/s. The same seed gives the same draw scaled by
    1/rate, so latency rises with the rate without the noise of a new draw at each one."""
    gaps = np.random.default_rng(seed).exponential(1.0, size=count)
    return (np.cumsum(gaps) / rate).tolist()


def simulate(arrivals: list[float], instances: int, times: BatchTimes, max_delay_s: float) -> np.ndarray:
    """Each request's latency (s, from its arrival to the end of its batch) through `instances` workers
    taking batches as serve/batcher.py does."""
    batch = times.max_batch
    cost = [times.of(items) for items in range(batch + 1)]
    padded = arrivals + [math.inf] * batch  # "the batch fills" never happens past the last arrival
    free = [0.0] * instances  # when each instance is next free (a heap)
    ends: list[float] = []  # when each request's batch ends, in arrival order
    first, count = 0, len(arrivals)
    pop, push, after = heapq.heappop, heapq.heappush, bisect.bisect_right  # the loop runs ~5,000 times
    while first < count:
        ready = pop(free)
        start = max(ready, min(arrivals[first] + max_delay_s, padded[first + batch - 1]))
        taken = min(batch, after(arrivals, start, first) - first)
        end = start + cost[taken]
        ends.extend([end] * taken)
        push(free, end)
        first += taken
    return np.asarray(ends) - np.asarray(arrivals)


def latency_at(rate: float, instances: int, times: BatchTimes, max_delay_s: float, quantile: float = QUANTILE,
               seed: int = 0) -> float:
    """The `quantile` latency (s) of the plan at `rate` requests/s (one item each)."""
    return float(np.percentile(simulate(poisson_arrivals(rate, seed=seed), instances, times, max_delay_s), quantile))


def slo_rate(instances: int, times: BatchTimes, max_delay_s: float, slo_s: float, quantile: float = QUANTILE,
             resolution: float = 0.01) -> float:
    """The highest Poisson rate (requests/s) whose `quantile` latency stays within `slo_s`; 0.0 when not
    even a lone request meets it. Bisection between 0 and the plan's capacity, to `resolution` (relative)."""
    if latency_at(LONE, instances, times, max_delay_s, quantile) > slo_s:
        return 0.0
    low, high = 0.0, instances * times.capacity
    for _ in range(MAX_BISECTIONS):
        if high - low <= resolution * low:
            break
        middle = (low + high) / 2
        if latency_at(middle, instances, times, max_delay_s, quantile) <= slo_s:
            low = middle
        else:
            high = middle
    return low
