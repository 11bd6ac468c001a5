"""Serving plans: instances x max batch, each plan's saturation images/s measured (or recalled) and the
simplest plan kept unless another beats it by a clear margin; the batcher's delay follows the plan."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from inceptionlab.hardware.cache import CacheKey, SpeedCache
from inceptionlab.hardware.calibration import measured_figures

# A serving plan with more instances or bigger batches is kept only if its saturation images/s reach at
# least this multiple of one instance unbatched: below that, batches and extra instances mostly add
# waiting. On the 2-core AMD EPYC, OpenVINO bf16 Inception v3 ran batch 8 at 1.11x batch 1's images/s,
# and the highest Poisson rate that held the p99 SLO was 21.6/s unbatched against 11-15/s with batches of 8.
BATCHING_PAYS = 1.25
AUTO_MAX_BATCH = 32
MAX_AUTO_INSTANCES = 4
SERVE_BUDGET_S = 20.0


@dataclass(frozen=True)
class ServePlan:
    """How a model is served: instances (batches in flight, each with its share of the CPUs) and max batch."""

    instances: int = 1
    max_batch: int = 1

    @property
    def label(self) -> str:
        return f"{self.instances}x{self.max_batch}"


def instance_threads(cpus: int, instances: int) -> int:
    """Each instance's share of the CPUs: instances x threads never exceeds what the process may use."""
    return max(1, cpus // max(1, instances))


def serve_plans(cpus: int, gpu: bool, instances: int | None, max_batch: int | None) -> list[ServePlan]:
    """The plans worth measuring: 1, 2, 4 ... instances (at most one per CPU; one on a GPU) x batch 1 or
    the largest bucket; a value the user set is kept as set."""
    counts = [instances] if instances else [n for n in (1, 2, 4) if n <= min(cpus, MAX_AUTO_INSTANCES)] or [1]
    if gpu and not instances:
        counts = [1]  # one device: extra instances only interleave kernels; batching is its lever
    batches = [max_batch] if max_batch else sorted({1, AUTO_MAX_BATCH})
    return [ServePlan(n, b) for n in counts for b in batches]


def pick_plan(plans: list[ServePlan], figures: Mapping[str, float], pays: float = BATCHING_PAYS) -> ServePlan:
    """The plan with the most images/s, if it beats the simplest plan by `pays`; else the simplest."""
    simplest = min(plans, key=lambda p: (p.instances, p.max_batch))
    measured = [p for p in plans if p.label in figures]
    if not measured or simplest.label not in figures:
        return simplest
    best = max(measured, key=lambda p: figures[p.label])
    return best if figures[best.label] >= pays * figures[simplest.label] else simplest


def auto_delay_ms(plan: ServePlan, single_img_per_s: float | None) -> float:
    """How long a request may wait for a batch to fill: 10% of one unbatched inference, 1-10 ms (a
    fuller batch is worth at most that much of a lone request's latency); 0 when unbatched."""
    if plan.max_batch == 1 or not single_img_per_s:
        return 0.0
    return round(min(10.0, max(1.0, 100.0 / single_img_per_s)), 1)


@dataclass
class ServeDecision:
    plan: ServePlan
    max_delay_ms: float
    img_per_s: dict[str, float] = field(default_factory=dict)
    source: str = "measured"
    seconds: float = 0.0
    threads: int | None = None  # per instance, on a CPU

    def line(self) -> str:
        figures = ", ".join(f"{label} {ips:.1f}" for label, ips in sorted(self.img_per_s.items(), key=lambda kv: -kv[1]))
        how = {"measured": f"measured in {self.seconds:.1f} s", "cached": "cached measurement", "probe": "as set",
               "pinned": "as set"}[self.source]
        threads = f", {self.threads} thread(s) each" if self.threads else ""
        evidence = f"; saturation img/s (instances x max batch): {figures}" if figures else ""
        return (f"serving plan: {self.plan.instances} instance(s){threads}, max batch {self.plan.max_batch}, "
                f"max delay {self.max_delay_ms:g} ms ({how}{evidence})")


def decide_serving(plans: list[ServePlan], measure: Callable[[ServePlan, float], float | None] | None, *,
                   cpus: int, gpu: bool, key: CacheKey | None = None, cache: SpeedCache | None = None,
                   fresh: bool = False, delay_ms: float | None = None,
                   clock: Callable[[], float] = time.perf_counter) -> ServeDecision:
    """Measure (or recall) each plan's saturation images/s and pick one; the delay follows the plan."""
    started = clock()
    if len(plans) == 1:
        figures, source = {}, "pinned"
        if delay_ms is None and plans[0].max_batch > 1 and measure is not None:
            figures, source = measured_figures([ServePlan(plans[0].instances, 1)], measure, key, cache, fresh,
                                               SERVE_BUDGET_S, {}, clock)
        choice = plans[0]
    else:
        candidates = list(dict.fromkeys([*plans, ServePlan(1, 1)]))
        figures, source = measured_figures(candidates, measure, key, cache, fresh, SERVE_BUDGET_S, {}, clock)
        choice = pick_plan(candidates, figures)
    unbatched = figures.get(ServePlan(choice.instances, 1).label)
    single = unbatched / choice.instances if unbatched else None  # one stream's images/s: 1 / latency
    delay = delay_ms if delay_ms is not None else auto_delay_ms(choice, single)
    threads = None if gpu else instance_threads(cpus, choice.instances)
    return ServeDecision(choice, delay, figures, source, clock() - started, threads)
