"""Serving plans: instances x max batch, each plan's saturation images/s measured (or recalled), each plan
simulated under Poisson arrivals from those figures (queueing.py), and the plan that holds the highest rate
within the latency objective kept; the batcher's delay follows the plan."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from inceptionlab import queueing
from inceptionlab.hardware.cache import CacheKey, SpeedCache
from inceptionlab.hardware.calibration import measured_figures

# A serving plan is chosen for the highest Poisson rate that holds a latency objective (--slo-ms, p99),
# simulated from each plan's measured batch times (queueing.py). Plans within this factor of the best
# rate count as equal, and the one with the lowest latency at a light load wins among them: on a
# 2-core AMD EPYC (demo model, OpenVINO bf16), 1 instance x 2 threads answered at p50 8-9 ms where 2 x 1
# thread took 12-14 ms at the same rates. Saturation (a closed loop of full batches), the figure
# measured, favours big batches that random arrivals rarely fill.
SLO_RATE_MARGIN = 1.1
DEFAULT_SLO_MS = 100.0  # a person waiting on an answer; the serving benchmark's objective too
# A model slower than the objective even alone (Inception v3 at 299 px on a 2-core AMD EPYC Zen 3: 116 ms
# per lone request) is planned for this many times its fastest plan's lone-request latency instead, the
# serving benchmark's own rule for its SLO. Planning for throughput there chose 2 instances x 32 (13.3
# img/s saturated), whose simulated rate within 5x is half that of 2 x 1 (3.9 against 7.7/s); measured
# under Poisson arrivals at 3-4.5/s, 2 x 32 answered at p50 ~217 ms where 1 x 1 did at ~125 ms.
SLOW_MODEL_SLO_FACTOR = 5.0
# "Latency at a light load" is compared at this share of the LOWEST rate any plan holds: a rate every plan
# serves with room to spare. 20% of the best plan's rate was 2.5x what the unbatched plans of the
# Fashion-MNIST MLP serve at all (200,000 against ~16,000 images/s), so their simulated queues grew for the
# whole run and a 0.08 ms model read "p50 95-138 ms light".
LIGHT_LOAD = 0.2
# --max-delay-ms auto: this share of the objective planned for (10 ms for a 100 ms p99), or no wait at all,
# whichever the simulation says holds the higher rate for the plan. The rule waits only under load, for the
# batch the load calls for. Simulated on the demo model's saturation figures (tests/test_serve_plan.py DEMO,
# a 2-core AMD EPYC) with 1.5-4 ms of host work per request, waits of at most 10 ms held the highest rate of
# 10, 25 and 50 ms with two instances, and within 7% of it with one; longer waits lost up to half the rate
# with two instances (a batch waiting while the other instance idles).
DELAY_SHARE = 0.1
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


def measured_plans(plans: list[ServePlan]) -> list[ServePlan]:
    """What is timed to judge `plans`: each, and the same instance count unbatched (its batch-1 time)."""
    return list(dict.fromkeys([*plans, *(ServePlan(p.instances, 1) for p in plans)]))


def batch_times(plan: ServePlan, figures: Mapping[str, float]) -> queueing.BatchTimes | None:
    """One instance's seconds per batch of 1 and of max_batch while all of the plan's instances run,
    from the saturation images/s of `plan` and of its unbatched twin; None when one is missing."""
    full, single = figures.get(plan.label), figures.get(ServePlan(plan.instances, 1).label)
    if not full or not single:
        return None
    return queueing.BatchTimes(plan.instances / single, plan.instances * plan.max_batch / full, plan.max_batch)


def plan_delays(plan: ServePlan, slo_ms: float, delay_ms: float | None) -> list[float]:
    """The delays (ms) to simulate the plan with: --max-delay-ms as set; else, for a batched plan,
    DELAY_SHARE of the objective (the longest a request waits for the batch its load calls for; under a
    light load it waits for nothing) and 0 (an instance takes what is queued when it is free); 0 unbatched."""
    if delay_ms is not None:
        return [delay_ms]
    return [0.0] if plan.max_batch == 1 else [round(DELAY_SHARE * slo_ms, 1), 0.0]


@dataclass(frozen=True)
class HostWork:
    """CPU seconds of one request's work outside the batches (decoding and transforming its image, the
    protocol's parsing and answer), measured at start-up on `sample`, run on the same cores as the batches."""

    seconds: float
    sample: str  # what was measured, e.g. "a 773x512 JPEG"


@dataclass(frozen=True)
class Machine:
    """What a plan runs on besides its batch times: the CPUs this process may use, a GPU or not, and each
    request's host work (None: not measured, left out)."""

    cpus: int
    gpu: bool = False
    host: HostWork | None = None

    def threads(self, plan: ServePlan) -> int:
        """The cores each instance keeps busy while it runs a batch (its threads; 1 on a GPU)."""
        return 1 if self.gpu else instance_threads(self.cpus, plan.instances)

    def cores(self, plan: ServePlan) -> queueing.Cores:
        return queueing.Cores(self.cpus, plan.instances * self.threads(plan), self.host.seconds if self.host else 0.0)


@dataclass(frozen=True)
class PlanModel:
    """One plan as the simulation sees it: its batch times, its batching rule, the cores it shares."""

    plan: ServePlan
    times: queueing.BatchTimes
    rule: queueing.BatchRule
    cores: queueing.Cores
    threads: int

    def latency_ms(self, rate: float, quantile: float) -> float:
        return 1e3 * queueing.latency_at(rate, self.plan.instances, self.times, self.rule, quantile, cores=self.cores,
                                         threads_per_instance=self.threads)

    def slo_rate(self, slo_ms: float) -> float:
        return queueing.slo_rate(self.plan.instances, self.times, self.rule, slo_ms / 1e3, cores=self.cores,
                                 threads_per_instance=self.threads)


def plan_model(plan: ServePlan, figures: Mapping[str, float], machine: Machine, delay_ms: float) -> PlanModel | None:
    """The plan's batch times, cores and batching rule (`queueing.BatchRule.for_cores`) with `delay_ms`;
    None when its figures are missing."""
    times = batch_times(plan, figures)
    if times is None:
        return None
    cores, threads = machine.cores(plan), machine.threads(plan)
    return PlanModel(plan, times, queueing.BatchRule.for_cores(times, cores, threads, delay_ms / 1e3), cores, threads)


@dataclass(frozen=True)
class PlanLatency:
    """What the simulation says of one plan: its highest rate within the SLO, its p50 at a light load,
    and the delay that holds it (of `plan_delays`)."""

    rate: float  # requests/s (Poisson) holding p99 <= SLO; 0: not even a lone request does
    light_p50_ms: float
    delay_ms: float = 0.0


def simulate_plans(plans: list[ServePlan], figures: Mapping[str, float], slo_ms: float, delay_ms: float | None,
                   machine: Machine) -> dict[str, PlanLatency]:
    """Each plan with measured batch times, through queueing.py at the SLO, with its batching rule and
    each request's host work on the same cores; of its delays (`plan_delays`), the one holding the
    higher rate (the shorter on a tie)."""
    chosen: dict[str, tuple[float, PlanModel, float]] = {}
    for plan in plans:
        for delay in plan_delays(plan, slo_ms, delay_ms):
            model = plan_model(plan, figures, machine, delay)
            if model is None:
                break
            rate = model.slo_rate(slo_ms)
            if plan.label not in chosen or (rate, -delay) > (chosen[plan.label][0], -chosen[plan.label][2]):
                chosen[plan.label] = (rate, model, delay)
    light = max(LIGHT_LOAD * min((rate for rate, _, _ in chosen.values() if rate > 0), default=0.0), queueing.LONE)
    return {label: PlanLatency(round(rate, 1), round(model.latency_ms(light, 50.0), 2), delay)
            for label, (rate, model, delay) in chosen.items()}


def pick_plan(plans: list[ServePlan], latency: Mapping[str, PlanLatency], figures: Mapping[str, float],
              margin: float = SLO_RATE_MARGIN) -> ServePlan:
    """The plan with the highest rate within the SLO, or one within `margin` of it with a lower p50 at a
    light load. No plan holds the SLO (a model slower than it even alone): the most images/s. Nothing
    measured: the simplest plan."""
    simplest = min(plans, key=lambda p: (p.instances, p.max_batch))
    held = [p for p in plans if p.label in latency and latency[p.label].rate > 0]
    if held:
        best = max(latency[p.label].rate for p in held)
        contenders = [p for p in held if latency[p.label].rate * margin >= best]
        return min(contenders, key=lambda p: (latency[p.label].light_p50_ms, p.instances, p.max_batch))
    measured = [p for p in plans if p.label in figures]
    return max(measured, key=lambda p: figures[p.label]) if measured else simplest


@dataclass
class ServeDecision:
    plan: ServePlan
    max_delay_ms: float
    img_per_s: dict[str, float] = field(default_factory=dict)
    source: str = "measured"
    seconds: float = 0.0
    threads: int | None = None  # per instance, on a CPU
    slo_ms: float = DEFAULT_SLO_MS  # the objective asked for
    latency: dict[str, PlanLatency] = field(default_factory=dict)
    planned_slo_ms: float | None = None  # the objective planned for: slo_ms unless no plan can hold it
    rule: queueing.BatchRule | None = None  # None: wait up to max_delay_ms for a full batch (Triton's rule)
    host: HostWork | None = None  # each request's host work, as measured and simulated

    def __post_init__(self) -> None:
        if self.planned_slo_ms is None:
            self.planned_slo_ms = self.slo_ms
        if self.rule is None:
            self.rule = queueing.BatchRule.full(self.plan.max_batch, self.max_delay_ms / 1e3)

    def line(self) -> str:
        how = {"measured": f"measured in {self.seconds:.1f} s", "cached": "cached measurement", "probe": "as set",
               "pinned": "as set"}[self.source]
        threads = f", {self.threads} thread(s) each" if self.threads else ""
        batching = f": {self.rule.describe()}" if self.plan.max_batch > 1 else ""
        host = f"; host work {1e3 * self.host.seconds:.2f} ms of CPU per request ({self.host.sample})" \
            if self.host else ""
        return (f"serving plan: {self.plan.instances} instance(s){threads}, max batch {self.plan.max_batch}, "
                f"max delay {self.max_delay_ms:g} ms{batching} ({how}{host}{self._evidence()})")

    def _evidence(self) -> str:
        shown = [label for label in self.img_per_s if label in self.latency] or list(self.img_per_s)
        if not shown:
            return ""
        saturation = ", ".join(f"{label} {self.img_per_s[label]:.1f}"
                               for label in sorted(shown, key=lambda label: -self.img_per_s[label]))
        rates = sorted(self.latency.items(), key=lambda kv: -kv[1].rate)
        if not any(plan.rate for _, plan in rates):
            return (f"; no plan holds p99 <= {self.slo_ms:g} ms here (--slo-ms), chosen for throughput; "
                    f"saturation img/s: {saturation}")
        held = ", ".join(f"{label} {plan.rate:.1f}/s (p50 {plan.light_p50_ms:g} ms light)" for label, plan in rates)
        objective = f"p99 <= {self.planned_slo_ms:g} ms"
        simulated = "simulated from batch times" + (" and host work" if self.host else "")
        if self.planned_slo_ms != self.slo_ms:
            return (f"; no plan holds p99 <= {self.slo_ms:g} ms here (--slo-ms); planned for {objective} "
                    f"({SLOW_MODEL_SLO_FACTOR:g}x the fastest lone request): highest Poisson rate holding it, "
                    f"{simulated}: {held}; saturation img/s: {saturation}")
        return f"; highest Poisson rate holding {objective}, {simulated}: {held}; saturation img/s: {saturation}"


def decide_serving(plans: list[ServePlan], measure: Callable[[ServePlan, float], float | None] | None, *,
                   cpus: int, gpu: bool, key: CacheKey | None = None, cache: SpeedCache | None = None,
                   fresh: bool = False, delay_ms: float | None = None, slo_ms: float = DEFAULT_SLO_MS,
                   clock: Callable[[], float] = time.perf_counter, host: HostWork | None = None) -> ServeDecision:
    """Measure (or recall) each plan's saturation images/s, simulate each under Poisson arrivals at the
    SLO with its batching rule and each request's `host` work, and pick one (`pick_plan`); the delay and
    the rule follow the plan. A single plan (instances and max batch set by the user) is kept; with its
    delay left auto, it and its batch-1 twin are timed for its rule; with everything set, it batches by
    Triton's rule (wait up to the delay for a full batch) and nothing is timed."""
    started = clock()
    machine = Machine(cpus, gpu, host)
    if len(plans) == 1:
        choice, figures, source, latency, planned_slo_ms = plans[0], {}, "pinned", {}, slo_ms
        if delay_ms is None and choice.max_batch > 1 and measure is not None:
            figures, source = measured_figures(measured_plans(plans), measure, key, cache, fresh, SERVE_BUDGET_S, {},
                                               clock, stop_when_spent=False)
            latency = simulate_plans(plans, figures, slo_ms, delay_ms, machine)
    else:
        figures, source = measured_figures(measured_plans(plans), measure, key, cache, fresh, SERVE_BUDGET_S, {},
                                           clock, stop_when_spent=False)
        planned_slo_ms, latency = objective_and_latency(plans, figures, slo_ms, delay_ms, machine)
        choice = pick_plan(plans, latency, figures)
    delay = latency[choice.label].delay_ms if choice.label in latency else plan_delays(choice, planned_slo_ms,
                                                                                       delay_ms)[0]
    model = plan_model(choice, figures, machine, delay)  # None: nothing timed, Triton's rule
    return ServeDecision(choice, delay, figures, source, clock() - started,
                         None if gpu else machine.threads(choice), slo_ms, latency, planned_slo_ms,
                         model.rule if model else None, host if latency else None)


def objective_and_latency(plans: list[ServePlan], figures: Mapping[str, float], slo_ms: float,
                          delay_ms: float | None, machine: Machine) -> tuple[float, dict[str, PlanLatency]]:
    """The objective to plan for and each plan simulated at it: `slo_ms`, unless no plan holds even that
    (every plan slower alone than the objective); then SLOW_MODEL_SLO_FACTOR x the fastest lone request."""
    latency = simulate_plans(plans, figures, slo_ms, delay_ms, machine)
    if not latency or any(plan.rate > 0 for plan in latency.values()):
        return slo_ms, latency
    relaxed = round(SLOW_MODEL_SLO_FACTOR * min(plan.light_p50_ms for plan in latency.values()), 1)
    return relaxed, simulate_plans(plans, figures, relaxed, delay_ms, machine)
