"""The calibration: time the candidates the probe left (warm-up excluded, bounded in time), keep one only
if it beats the safe configuration by a clear margin, and say why (`Decision`)."""

from __future__ import annotations

import copy
import logging
import math
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Mapping

from inceptionlab.hardware.cache import CacheKey, SpeedCache
from inceptionlab.hardware.candidates import AUTO_ENV, Candidate, baseline_of

log = logging.getLogger(__name__)

# A candidate must run at least this much faster than the safe configuration to be chosen: smaller
# gains are within the run-to-run noise of a 2-core CPU (identical runs drifted 5-10% there).
CLEAR_MARGIN = 1.10
# Calibration time bound per decision, and per candidate at most its share of it.
CALIBRATION_BUDGET_S = 20.0
MIN_TIMED_STEPS = 2
MAX_TIMED_STEPS = 5


def gflop_per_sample(model: Any, input_shape: tuple[int, ...]) -> float | None:
    """Forward GFLOP of one image (a multiply-add counts 2), counted on meta tensors: no compute.

    Inception v3: 11.4 GFLOP at 299 px, 0.82 at 80 px. None for token inputs or a model the counter
    cannot trace (an op without a meta kernel).
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode  # only when counting

    if len(input_shape) != 3:
        return None
    try:
        meta = copy.deepcopy(model).to("meta").eval()
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            meta(torch.empty(1, *input_shape, device="meta"))
    except Exception:
        log.debug("FLOP count failed for %s", type(model).__name__, exc_info=True)
        return None
    return round(counter.get_total_flops() / 1e9, 3)


@dataclass
class Decision:
    """What `auto` chose, and the evidence: images/s per candidate and why others were not tried."""

    choice: Candidate
    img_per_s: dict[str, float] = field(default_factory=dict)
    ruled_out: dict[str, str] = field(default_factory=dict)
    source: str = "measured"  # measured | cached | probe | pinned | safe
    seconds: float = 0.0
    batch: int | None = None  # the batch the candidates were timed at, when smaller than the run's
    candidates: list[str] = field(default_factory=list)  # every label the probe allowed

    def line(self, what: str = "speed") -> str:
        return f"{what}: {self.summary()}"

    def summary(self) -> str:
        figures = ", ".join(f"{label} {ips:.1f}" for label, ips in sorted(self.img_per_s.items(), key=lambda kv: -kv[1]))
        how = {"measured": f"measured in {self.seconds:.1f} s", "cached": "cached measurement",
               "probe": "probe only", "pinned": "as set", "safe": f"{AUTO_ENV}=safe"}[self.source]
        at = f" at batch {self.batch}" if self.batch else ""
        evidence = f"; img/s{at}: {figures}" if figures else ""
        if self.source == "probe" and len(self.candidates) > 1:
            how = f"the safe choice until measured; candidates {', '.join(self.candidates)}"
        dropped = [f"{k}: {v}" for k, v in self.ruled_out.items() if k in ("bf16", "fp16")]
        ruled = f"; ruled out {'; '.join(dropped)}" if dropped else ""
        return f"{self.choice.label} ({how}{evidence}{ruled})"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        return cls(Candidate(**data["choice"]), dict(data["img_per_s"]), dict(data["ruled_out"]), data["source"],
                   float(data["seconds"]), data.get("batch"), list(data.get("candidates", [])))

    def to_dict(self) -> dict[str, Any]:
        return {"choice": asdict(self.choice), "label": self.choice.label, "img_per_s": self.img_per_s,
                "ruled_out": self.ruled_out, "source": self.source, "seconds": round(self.seconds, 2),
                "batch": self.batch, "candidates": self.candidates}


Measure = Callable[[Candidate, float], float | None]  # (candidate, seconds allowed) -> images/s or None


def decide(candidates: list[Candidate], measure: Measure | None, *, key: CacheKey | None = None,
           cache: SpeedCache | None = None, fresh: bool = False, budget_s: float = CALIBRATION_BUDGET_S,
           margin: float = CLEAR_MARGIN, ruled_out: Mapping[str, str] | None = None,
           clock: Callable[[], float] = time.perf_counter) -> Decision:
    """Pick the fastest candidate, or the safe one unless another beats it by `margin`.

    Figures already in the cache are reused (`fresh` ignores them); only missing candidates are
    timed, each within an equal share of `budget_s`. A candidate that fails or gives no figure is
    dropped, never chosen. Without `measure` nothing is timed: the cache decides, else the probe
    (the safe candidate), which is what `doctor` shows before anything was measured.
    """
    ruled = dict(ruled_out or {})
    baseline = baseline_of(candidates)
    if len(candidates) == 1:
        source = "safe" if "auto" in ruled else "probe" if ruled else "pinned"
        return Decision(candidates[0], {}, ruled, source)
    started = clock()
    figures, source = measured_figures(candidates, measure, key, cache, fresh, budget_s, ruled, clock)
    return Decision(pick(candidates, figures, baseline, margin), figures, ruled, source, clock() - started,
                    candidates=[c.label for c in candidates])


def measured_figures(candidates: list[Any], measure: Callable[[Any, float], float | None] | None,
                     key: CacheKey | None, cache: SpeedCache | None, fresh: bool, budget_s: float,
                     ruled: dict[str, str], clock: Callable[[], float] = time.perf_counter) -> tuple[dict[str, float], str]:
    """Images/s per candidate label: the cache's, plus the missing ones timed within `budget_s`.

    Returns (figures, source): measured | cached | probe (nothing known, nothing timed).
    """
    known = {} if (fresh or key is None or cache is None) else cache.load(key)
    missing = [c for c in candidates if c.label not in known] if measure is not None else []
    started = clock()
    measured: dict[str, float] = {}
    for index, candidate in enumerate(missing):
        share = max(0.0, budget_s - (clock() - started)) / (len(missing) - index)
        figure = _measure_safely(measure, candidate, share)
        if figure is None:
            ruled[candidate.label] = "failed or too slow to measure here"
        else:
            measured[candidate.label] = figure
    if measured and key is not None and cache is not None:
        cache.store(key, measured)
    both = {**known, **measured}
    figures = {c.label: both[c.label] for c in candidates if c.label in both}
    return figures, "measured" if measured else "cached" if figures else "probe"


def _measure_safely(measure: Callable[[Any, float], float | None], candidate: Any, seconds: float) -> float | None:
    try:
        figure = measure(candidate, seconds)
    except Exception:  # a candidate the stack cannot run (a missing kernel, a compile error)
        log.warning("speed calibration: %s failed", candidate.label, exc_info=True)
        return None
    return figure if figure is not None and math.isfinite(figure) and figure > 0 else None


def pick(candidates: list[Candidate], figures: Mapping[str, float], baseline: Candidate, margin: float) -> Candidate:
    """The fastest measured candidate if it beats the baseline by `margin`; else the baseline."""
    measured = [c for c in candidates if c.label in figures]
    if not measured:
        return baseline
    best = max(measured, key=lambda c: figures[c.label])
    base = figures.get(baseline.label)
    if best == baseline or (base is not None and figures[best.label] < margin * base):
        return baseline
    if base is None and baseline in candidates:
        return baseline  # the safe configuration could not be timed: nothing to compare against
    return best


def time_steps(step: Callable[[], None], batch: int, seconds: float, clock: Callable[[], float] = time.perf_counter,
               min_steps: int = MIN_TIMED_STEPS, max_steps: int = MAX_TIMED_STEPS) -> float | None:
    """Images/s of `step` (which must end with the device synchronised): one warm-up call untimed
    (kernel search, oneDNN primitive creation), then timed calls until `max_steps` or `seconds`.

    The median step is used: the first timed steps on a GPU can still include autotuning. None when
    the warm-up alone used the whole share (the candidate is too slow to be the answer here).
    """
    start = clock()
    step()
    if clock() - start > seconds and seconds > 0:
        return None
    times: list[float] = []
    while len(times) < max_steps and (len(times) < min_steps or clock() - start < seconds):
        began = clock()
        step()
        times.append(clock() - began)
    return batch / statistics.median(times)


def replace_choice(decision: Decision, **changes: Any) -> Decision:
    return replace(decision, choice=replace(decision.choice, **changes))
