"""The calibration: time the candidates the probe left (warm-up excluded, bounded in time), keep one only
if it beats the safe configuration by a clear margin, and say why (`Decision`)."""

from __future__ import annotations

import copy
import gc
import logging
import math
import statistics
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Mapping

from inceptionlab.errors import UserError
from inceptionlab.hardware.cache import CacheKey, SpeedCache
from inceptionlab.hardware.candidates import AUTO_ENV, Candidate, baseline_of

log = logging.getLogger(__name__)

# A candidate must run at least this much faster than the safe configuration to be chosen: smaller
# gains are within the run-to-run noise of a 2-core CPU (identical runs drifted 5-10% there).
CLEAR_MARGIN = 1.10
# Calibration time bound per decision, and per candidate at most its share of it.
CALIBRATION_BUDGET_S = 20.0
# On a GPU each candidate's warm-up is cuDNN's kernel search for its dtype and layout: 5-6 s per candidate
# for Inception v3 at batch 32 on an H200 (2026-12-04), then ~40 ms steps; 20 s timed none of four there.
# The runs that calibrate on a GPU are long (one tiny-imagenet epoch is 100,000 images), and a DDP rank
# waits for rank 0's decision well inside NCCL's 10-minute timeout.
GPU_CALIBRATION_BUDGET_S = 60.0
MIN_TIMED_STEPS = 2
MAX_TIMED_STEPS = 5


def calibration_budget(facts: Any) -> float:
    """Seconds the calibration may spend on this device (`DeviceFacts`)."""
    return CALIBRATION_BUDGET_S if facts.kind == "cpu" else GPU_CALIBRATION_BUDGET_S


def gflop_per_sample(model: Any, input_shape: tuple[int, ...]) -> float | None:
    """Forward GFLOP of one image (a multiply-add counts 2), counted on meta tensors: no compute.

    Inception v3: 11.4 GFLOP at 299 px, 0.82 at 80 px. None for token inputs or a model the counter
    cannot trace (an op without a meta kernel).
    """
    import torch  # start-up time: the package is imported before torch
    from torch.utils.flop_counter import FlopCounterMode  # start-up time: ~0.7 s (triton), only when counting

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
    note: str | None = None  # why the choice is not the usual rule's (the safe configuration could not run)

    def line(self, what: str = "speed") -> str:
        return f"{what}: {self.summary()}"

    def summary(self) -> str:
        figures = ", ".join(f"{label} {ips:.1f}" for label, ips in sorted(self.img_per_s.items(), key=lambda kv: -kv[1]))
        how = {"measured": f"measured in {self.seconds:.1f} s" if figures else
               f"the safe choice: nothing could be timed in {self.seconds:.1f} s",
               "cached": "cached measurement" if figures else "the safe choice: nothing could be timed before",
               "probe": "probe only", "pinned": "as set", "safe": f"{AUTO_ENV}=safe"}[self.source]
        at = f" at batch {self.batch}" if self.batch else ""
        evidence = f"; img/s{at}: {figures}" if figures else ""
        if self.source == "probe" and len(self.candidates) > 1:
            how = f"the safe choice until measured; candidates {', '.join(self.candidates)}"
        dropped = [f"{k}: {v}" for k, v in self.ruled_out.items() if k in ("bf16", "fp16")]
        ruled = f"; ruled out {'; '.join(dropped)}" if dropped else ""
        note = f"; {self.note}" if self.note else ""
        return f"{self.choice.label} ({how}{evidence}{note}{ruled})"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        return cls(Candidate(**data["choice"]), dict(data["img_per_s"]), dict(data["ruled_out"]), data["source"],
                   float(data["seconds"]), data.get("batch"), list(data.get("candidates", [])), data.get("note"))

    def to_dict(self) -> dict[str, Any]:
        return {"choice": asdict(self.choice), "label": self.choice.label, "img_per_s": self.img_per_s,
                "ruled_out": self.ruled_out, "source": self.source, "seconds": round(self.seconds, 2),
                "batch": self.batch, "candidates": self.candidates, "note": self.note}


Measure = Callable[[Candidate, float], float | None]  # (candidate, seconds allowed) -> images/s or None

# How a candidate that gave no figure is reported. One that raised (RAN_AND_FAILED) or was too slow is
# cached with its reason, so the next run decides the same without running it again (`fresh` retries);
# one that was not timed because the budget was spent is not: nothing was learnt about it.
OUT_OF_MEMORY = "out of memory"
FAILED = "failed:"
RAN_AND_FAILED = (OUT_OF_MEMORY, FAILED)
NOT_TIMED = "not timed:"


def decide(candidates: list[Candidate], measure: Measure | None, *, key: CacheKey | None = None,
           cache: SpeedCache | None = None, fresh: bool = False, budget_s: float = CALIBRATION_BUDGET_S,
           margin: float = CLEAR_MARGIN, ruled_out: Mapping[str, str] | None = None,
           clock: Callable[[], float] = time.perf_counter) -> Decision:
    """Pick the fastest candidate, or the safe one unless another beats it by `margin`.

    Figures (and failures) already in the cache are reused (`fresh` ignores them); only missing
    candidates are timed, each within an equal share of what is left of `budget_s`, and none once it
    is spent. Candidates are timed eager: torch.compile is the probe's decision (candidates.py), and
    the choice carries it. A candidate that fails or gives no figure is never chosen; when the safe
    configuration is one of them the fastest candidate that ran is, and the decision says why; when
    every candidate failed, a UserError says what each one hit. Without `measure` nothing is timed:
    the cache decides, else the probe (the safe candidate), which is what `doctor` shows before
    anything was measured.
    """
    ruled = dict(ruled_out or {})
    compiled = bool(candidates) and all(c.compile for c in candidates)
    timed = list(dict.fromkeys(replace(c, compile=False) for c in candidates))
    baseline = baseline_of(timed)
    if len(timed) == 1:
        source = "safe" if "auto" in ruled else "probe" if ruled else "pinned"
        return Decision(replace(timed[0], compile=compiled), {}, ruled, source)
    started = clock()
    figures, source = measured_figures(timed, measure, key, cache, fresh, budget_s, ruled, clock)
    _refuse_if_nothing_ran(timed, figures, ruled)
    choice = pick(timed, figures, baseline, margin)
    note = None
    if choice != baseline and baseline.label not in figures and baseline.label in ruled:
        note = f"{baseline.label} could not run ({ruled[baseline.label]}): the fastest candidate that ran"
    return Decision(replace(choice, compile=compiled), figures, ruled, source, clock() - started,
                    candidates=[c.label for c in timed], note=note)


def _refuse_if_nothing_ran(candidates: list[Candidate], figures: Mapping[str, float], ruled: Mapping[str, str]) -> None:
    failed = {c.label: ruled.get(c.label, "") for c in candidates}
    if figures or not all(reason.startswith(RAN_AND_FAILED) for reason in failed.values()):
        return
    reasons = "; ".join(f"{label}: {reason}" for label, reason in failed.items())
    raise UserError(f"no speed setting could run here ({reasons}); a smaller batch may fit, or set the precision, "
                    "memory format and compile explicitly (failures are cached: `inceptionlab doctor --calibrate` "
                    "measures again)")


def measured_figures(candidates: list[Any], measure: Callable[[Any, float], float | None] | None,
                     key: CacheKey | None, cache: SpeedCache | None, fresh: bool, budget_s: float,
                     ruled: dict[str, str], clock: Callable[[], float] = time.perf_counter, *,
                     stop_when_spent: bool = True) -> tuple[dict[str, float], str]:
    """Images/s per candidate label: the cache's, plus the missing ones timed within `budget_s`; `ruled`
    gets each candidate without a figure and why (the cache's failures included). With
    `stop_when_spent`, no candidate runs once the budget is spent; without, each still gets what its
    measure allots itself (serving plans: 0.5-2 s each, every plan needed for the comparison).

    Returns (figures, source): measured | cached | probe (nothing known, nothing timed).
    """
    cached = cache is not None and key is not None and not fresh
    known = cache.load(key) if cached else {}
    failures = cache.failures(key) if cached else {}
    known_failed = {c.label: failures[c.label] for c in candidates if c.label in failures and c.label not in known}
    ruled.update(known_failed)
    missing = [c for c in candidates if c.label not in known and c.label not in known_failed] if measure else []
    started = clock()
    measured: dict[str, float] = {}
    failed: dict[str, str] = {}
    for index, candidate in enumerate(missing):
        left = budget_s - (clock() - started)
        if left <= 0 and stop_when_spent:  # spent: nothing more runs (the safe candidate comes first)
            for rest in missing[index:]:
                ruled[rest.label] = f"{NOT_TIMED} the calibration's {budget_s:g} s were spent"
            break
        figure, why = _measure_safely(measure, candidate, max(0.0, left) / (len(missing) - index))
        if figure is None:
            failed[candidate.label] = ruled[candidate.label] = why
        else:
            measured[candidate.label] = figure
    if (measured or failed) and key is not None and cache is not None:
        cache.store(key, measured, failed)
    both = {**known, **measured}
    figures = {c.label: both[c.label] for c in candidates if c.label in both}
    return figures, "measured" if measured or failed else "cached" if figures or known_failed else "probe"


def _measure_safely(measure: Callable[[Any, float], float | None], candidate: Any,
                    seconds: float) -> tuple[float | None, str]:
    """(images/s, "") or (None, why not). After an out-of-memory failure the candidate's memory is given
    back to the device before the next one runs."""
    try:
        figure = measure(candidate, seconds)
    except Exception as exc:  # a candidate the stack cannot run (a missing kernel, out of memory)
        # The traceback as text: a log record holding the exception would keep the failed candidate's
        # tensors (its frames' locals) alive, and with them the device memory it held.
        log.warning("speed calibration: %s failed\n%s", candidate.label, traceback.format_exc())
        why = _failure(exc)
    else:
        if figure is not None and math.isfinite(figure) and figure > 0:
            return figure, ""
        return None, f"too slow to measure here (a step after its warm-up took most of its {seconds:.1f} s share)"
    if why.startswith(OUT_OF_MEMORY):  # outside the handler: the exception and its frames are gone
        free_device_memory()
    return None, why


def _failure(exc: Exception) -> str:
    import torch  # start-up time: the package is imported before torch

    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text.lower():
        return f"{OUT_OF_MEMORY} ({first[:200]})"
    return f"{FAILED} {type(exc).__name__}: {first[:200]}"


def free_device_memory() -> None:
    """Collect what the failed or finished candidates left (model copies, optimizer state, activations)
    and give the GPU's cached blocks back to the driver: the run's own model and its resident data are
    placed next. A no-op where CUDA was never initialised."""
    import torch  # start-up time: the package is imported before torch

    gc.collect()
    torch.cuda.empty_cache()


def pick(candidates: list[Candidate], figures: Mapping[str, float], baseline: Candidate, margin: float) -> Candidate:
    """The fastest measured candidate if it beats the baseline by `margin`; else the baseline. When the
    baseline gave no figure (it failed or was too slow), the fastest candidate that did."""
    measured = [c for c in candidates if c.label in figures]
    if not measured:
        return baseline
    best = max(measured, key=lambda c: figures[c.label])
    base = figures.get(baseline.label)
    if base is None:
        return best
    if best == baseline or figures[best.label] < margin * base:
        return baseline
    return best


def time_steps(step: Callable[[], None], batch: int, seconds: float, clock: Callable[[], float] = time.perf_counter,
               min_steps: int = MIN_TIMED_STEPS, max_steps: int = MAX_TIMED_STEPS) -> float | None:
    """Images/s of `step` (which must end with the device synchronised): one warm-up call untimed
    (kernel search, oneDNN primitive creation), then timed calls until `max_steps` or `seconds`.

    The median step is used: the first timed steps on a GPU can still include autotuning. None when
    no time is left (nothing runs), or when the warm-up used the whole share and the step after it
    still takes more than a `min_steps`-th of it (the candidate is too slow to be the answer here).
    A long warm-up alone is no verdict: on a GPU it is the kernel search (5-6 s per candidate on an
    H200, then ~40 ms steps), so such a candidate costs its warm-up and `min_steps` steps.
    """
    if seconds <= 0:
        return None
    start = clock()
    step()
    times: list[float] = []
    if clock() - start > seconds:
        began = clock()
        step()
        times.append(clock() - began)
        if times[0] > seconds / min_steps:
            return None
    while len(times) < max_steps and (len(times) < min_steps or clock() - start < seconds):
        began = clock()
        step()
        times.append(clock() - began)
    return batch / statistics.median(times)


def replace_choice(decision: Decision, **changes: Any) -> Decision:
    return replace(decision, choice=replace(decision.choice, **changes))
