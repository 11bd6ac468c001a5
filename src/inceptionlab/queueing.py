"""The batching rule, and a dynamic batcher under Poisson arrivals simulated with it: the latency a serving
plan gives at a request rate.

**The rule** (`BatchRule`; serve/batcher.py applies it to real requests, `simulate` here to simulated ones).
A free instance takes what is queued, up to `max_batch` items, as soon as the queue holds the batch the
current load calls for (`target`), or once the oldest request has waited `max_delay`, whichever comes
first. The target follows the arrival rate (estimated over the last RATE_WINDOW arrivals): under a light
load it is 1, so a lone request runs at once; as the rate grows, the target is the smallest batch whose
CPU per request (its share of the batch's run on the instance's threads, plus the request's host work:
decoding, transforming, the protocol) keeps the cores at most CPU_BUSY busy at that rate. On a CPU a
batch of one pays a whole run on every thread of its instance; a batch of 8 shares one. This is Triton's
preferred batch sizes with a queue delay, with the preferred size chosen from the measured batch-time
curve and the load, as Clipper's adaptive batching chooses it from its latency objective. A rule without
a curve (`BatchRule.full`) waits for `max_batch` items as Triton's plain dynamic batcher does.

**The simulation.** `serve` picks its plan (instances x max batch, hardware.decide_serving) for the highest
rate of random arrivals that still holds a latency objective, since that is what a server is for; a closed
loop at saturation (the figure measured at start-up) favours big batches that random arrivals rarely fill.
Timing every plan under Poisson load at start-up would take minutes for a slow model (a p99 needs hundreds
of requests per rate); instead each plan's batch times are measured once (batch 1 and its largest batch,
with all its instances running: `BatchTimes`) and the queue is simulated here, with the rule above, on the
first free instance, each batch padded up to the next bucket (1, 2, 4, ... max_batch).

The host work of each request (`Cores`: measured at start-up on a sample image) runs on the same cores as
the instances' threads: at `rate` requests/s it keeps rate x host seconds of cores busy, and the batches
run slower by the cores they lose (`Cores.stretch`). What the simulation leaves out: the HTTP server's own
work per request, any other program on the machine (a load generator on the same cores), and that idle
instances would run faster than measured with all of them busy.
Pure Python and numpy, no torch: ~10 ms per simulated rate.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

ARRIVALS = 5000  # per simulated rate: ~50 requests above a p99, from the same seeded draw at every rate
QUANTILE = 99.0
LONE = 1e-6  # requests/s at which every request meets an empty server
MAX_BISECTIONS = 30
# The arrival rate the rule acts on: requests over the last 16 arrivals (the newest included): at 100
# requests/s, the last 0.15 s. A lone request after a quiet spell reads as the quiet rate, so it runs at
# once; a burst after one counts fully once 16 of its requests have come (meanwhile each one that meets a
# free instance runs at once, and those queued behind a running batch go together as before).
RATE_WINDOW = 16
# The cores' busy share the rule plans batches for: a batch just big enough for the cores to keep up
# (100%) leaves no room for the arrivals' bursts, and its queue grows without bound at the first one.
CPU_BUSY = 0.6
# A bigger batch is worth waiting for only if it cuts the CPU per request by at least this share: on a
# model whose batches cost as much per image as single runs (a large model on few cores), the rule never
# waits.
PAYS = 0.1


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

    def buckets(self) -> list[int]:
        """The batch sizes the instance runs: 1, 2, 4, ... and max_batch."""
        sizes = [1 << i for i in range(self.max_batch.bit_length()) if 1 << i < self.max_batch]
        return [*sizes, self.max_batch]


@dataclass(frozen=True)
class Cores:
    """The CPU cores a server has, the ones its instances' threads keep busy while they run a batch, and the
    CPU seconds of each request's host work (decoding, transforming, the protocol) on the same cores."""

    cores: float
    threads: float  # instances x threads per instance (1 per instance on a GPU: the thread launching it)
    host_s: float = 0.0

    def stretch(self, rate: float) -> float:
        """How much slower batches run at `rate` requests/s, the host work taking its cores first (>= 1);
        inf when the host work alone needs every core."""
        free = self.cores - rate * self.host_s
        if free <= 0:
            return math.inf
        return max(1.0, self.threads / free)

    @property
    def most_requests(self) -> float:
        """Requests/s the host work alone would keep every core busy at."""
        return self.cores / self.host_s if self.host_s > 0 else math.inf


@dataclass(frozen=True)
class BatchRule:
    """The batch a free instance waits for at each arrival rate: `steps` are (highest rate, batch) in
    ascending order; above the last rate, the last batch; no steps: `max_batch` (Triton's rule). A request
    never waits longer than `max_delay_s` for its batch to fill."""

    max_batch: int
    max_delay_s: float
    steps: tuple[tuple[float, int], ...] = ()

    @classmethod
    def full(cls, max_batch: int, max_delay_s: float) -> "BatchRule":
        """Triton's plain dynamic batching: wait up to the delay for a full batch, whatever the load."""
        return cls(max_batch, max_delay_s)

    @classmethod
    def for_cores(cls, times: BatchTimes, cores: Cores, threads_per_instance: float,
                  max_delay_s: float) -> "BatchRule":
        """From the batch-time curve: each bucket that cuts the CPU per request by PAYS or more against the
        smaller ones, and the highest rate at which it keeps the cores CPU_BUSY busy."""
        steps: list[tuple[float, int]] = []
        cheapest = math.inf
        for batch in times.buckets():
            per_request = cores.host_s + threads_per_instance * times.of(batch) / batch
            if per_request <= (1 - PAYS) * cheapest or not steps:
                steps.append((CPU_BUSY * cores.cores / per_request, batch))
                cheapest = per_request
        return cls(times.max_batch, max_delay_s, tuple(steps))

    def target(self, rate: float) -> int:
        """The batch to wait for at `rate` requests/s."""
        if not self.steps:
            return self.max_batch
        for highest, batch in self.steps:
            if rate <= highest:
                return batch
        return self.steps[-1][1]

    def targets(self, arrivals: Sequence[float]) -> list[int]:
        """The target at each arrival, from the rate the batcher estimates then (`ArrivalRate`)."""
        if not self.steps:
            return [self.max_batch] * len(arrivals)
        times = np.asarray(arrivals, dtype=np.float64)
        index = np.arange(len(times))
        oldest = np.maximum(index - (RATE_WINDOW - 1), 0)
        span = times - times[oldest]
        with np.errstate(divide="ignore", invalid="ignore"):
            rates = np.where(span > 0, (index - oldest) / span, np.where(index > oldest, np.inf, 0.0))
        highest = np.asarray([rate for rate, _ in self.steps])
        batches = np.asarray([batch for _, batch in self.steps] + [self.steps[-1][1]])
        return batches[np.searchsorted(highest, rates, side="left")].tolist()

    def describe(self) -> str:
        """The rule in words, for the start-up line."""
        if not self.steps:
            return f"waits up to {1e3 * self.max_delay_s:g} ms for {self.max_batch}"
        if len(self.steps) == 1:
            return "takes what is queued when an instance is free (a bigger batch does not pay here)"
        if self.max_delay_s == 0:
            return "takes what is queued when an instance is free (waiting for a bigger batch does not pay here)"
        shown = ", ".join(f"{batch} from {previous:.0f}/s" for (previous, _), (_, batch)
                          in zip(self.steps, self.steps[1:]))
        return f"runs at once below {self.steps[0][0]:.0f}/s, then waits up to {1e3 * self.max_delay_s:g} ms for {shown}"


class ArrivalRate:
    """Requests/s over the last RATE_WINDOW arrivals (the newest included): what the batcher's rule reads.
    `BatchRule.targets` computes the same figure for a whole simulated schedule."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def arrived(self, at: float) -> None:
        self.times.append(at)
        if len(self.times) > RATE_WINDOW:
            del self.times[0]

    @property
    def rate(self) -> float:
        if len(self.times) < 2:
            return 0.0
        span = self.times[-1] - self.times[0]
        return (len(self.times) - 1) / span if span > 0 else math.inf


def poisson_arrivals(rate: float, count: int = ARRIVALS, seed: int = 0) -> list[float]:
    """Arrival times (s) of `count` requests at `rate`/s. The same seed gives the same draw scaled by
    1/rate, so latency rises with the rate without the noise of a new draw at each one."""
    gaps = np.random.default_rng(seed).exponential(1.0, size=count)
    return (np.cumsum(gaps) / rate).tolist()


def schedule(arrivals: list[float], instances: int, times: BatchTimes, rule: BatchRule,
             stretch: float = 1.0) -> tuple[np.ndarray, list[int]]:
    """When each request's batch ends (s, in arrival order), and the items of each batch, through
    `instances` workers taking batches by `rule`, as serve/batcher.py does; batches run `stretch` times
    slower than measured."""
    batch, delay = times.max_batch, rule.max_delay_s
    targets = rule.targets(arrivals)
    cost = [stretch * times.of(items) for items in range(batch + 1)]
    free = [0.0] * instances  # when each instance is next free (a heap)
    ends: list[float] = []  # when each request's batch ends, in arrival order
    sizes: list[int] = []
    first, count = 0, len(arrivals)
    pop, push, after = heapq.heappop, heapq.heappush, bisect.bisect_right  # the loop runs ~5,000 times
    while first < count:
        now = max(pop(free), arrivals[first])
        deadline = arrivals[first] + delay
        last = after(arrivals, now, first) - 1  # the newest arrival by now: its target is the current one
        start = now
        if now < deadline and last - first + 1 < targets[last]:
            start = deadline  # the target batch never filled in time
            for newest in range(last + 1, min(count, first + batch)):
                if arrivals[newest] > deadline:
                    break
                if newest - first + 1 >= targets[newest]:
                    start = arrivals[newest]
                    break
        taken = min(batch, after(arrivals, start, first) - first)
        end = start + cost[taken]
        ends.extend([end] * taken)
        sizes.append(taken)
        push(free, end)
        first += taken
    return np.asarray(ends), sizes


def simulate(arrivals: list[float], instances: int, times: BatchTimes, rule: BatchRule,
             stretch: float = 1.0) -> np.ndarray:
    """Each request's latency (s, from its arrival to the end of its batch) through the batcher (`schedule`)."""
    ends, _ = schedule(arrivals, instances, times, rule, stretch)
    return ends - np.asarray(arrivals)


def latency_at(rate: float, instances: int, times: BatchTimes, rule: BatchRule, quantile: float = QUANTILE,
               seed: int = 0, cores: Cores | None = None, threads_per_instance: float = 1.0) -> float:
    """The `quantile` latency (s) of the plan at `rate` requests/s (one item each).

    With `cores`, each request's host work runs on the cores beside the batches: the batches run
    `Cores.stretch` slower, and the host work, sharing the cores with everything else, takes its CPU
    seconds h and waits h x busy / (1 - busy) more on average (processor sharing: h / (1 - busy) in
    all), the wait drawn exponentially. The cores' busy share counts the batches' CPU (each batch's
    measured time on `threads_per_instance` threads), so batches of one, which cost the most CPU per
    request, slow every request's decoding too. inf when the cores cannot keep up."""
    arrivals = poisson_arrivals(rate, seed=seed)
    if cores is None:
        return float(np.percentile(simulate(arrivals, instances, times, rule), quantile))
    stretch = cores.stretch(rate)
    if math.isinf(stretch):
        return math.inf
    ends, sizes = schedule(arrivals, instances, times, rule, stretch)
    batch_cpu = threads_per_instance * sum(times.of(items) for items in sizes)
    busy = (rate * cores.host_s + batch_cpu / arrivals[-1]) / cores.cores
    if busy >= 1:
        return math.inf
    host = cores.host_s + np.random.default_rng(seed + 1).exponential(cores.host_s * busy / (1 - busy),
                                                                       size=len(arrivals))
    return float(np.percentile(ends - np.asarray(arrivals) + host, quantile))


def slo_rate(instances: int, times: BatchTimes, rule: BatchRule, slo_s: float, quantile: float = QUANTILE,
             resolution: float = 0.01, cores: Cores | None = None, threads_per_instance: float = 1.0) -> float:
    """The highest Poisson rate (requests/s) whose `quantile` latency stays within `slo_s`; 0.0 when not
    even a lone request meets it. Bisection between 0 and the plan's capacity (and the rate at which the
    host work alone fills the cores), to `resolution` (relative)."""
    def latency(rate: float) -> float:
        return latency_at(rate, instances, times, rule, quantile, cores=cores, threads_per_instance=threads_per_instance)

    if latency(LONE) > slo_s:
        return 0.0
    low, high = 0.0, min(instances * times.capacity, cores.most_requests if cores else math.inf)
    for _ in range(MAX_BISECTIONS):
        if high - low <= resolution * low:
            break
        middle = (low + high) / 2
        if latency(middle) <= slo_s:
            low = middle
        else:
            high = middle
    return low
