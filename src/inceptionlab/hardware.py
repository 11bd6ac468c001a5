"""What this machine is and what is fast on it: the one place that decides speed settings.

A speed setting (precision, memory format, torch.compile, threads) is never copied from another
machine. It is decided in two stages:

1. a capability probe that costs nothing rules candidates out: a CPU without bf16 units (oneDNN's own
   check) never runs bf16 under `auto`; a GPU's compute capability or gfx architecture says which
   precisions it has units for (the tables below, each row with its source);
2. a short calibration on the real model, input size, batch and device times the remaining candidates
   (warm-up excluded, bounded in time) and keeps one only if it beats the safe configuration (fp32,
   NCHW, eager) by a clear margin.

Measurements are cached on disk per device, capability, torch version, model, input shape, batch and
thread count (`SpeedCache`), so a second run decides instantly; `doctor --calibrate` measures afresh.
An explicit setting always wins: only the `auto` dimensions are searched.

Why not a fixed fast path: bf16 autocast was 4x fp32 on an Intel Xeon with AMX, 1.8x on an AMD EPYC
Zen 4 (AVX-512 bf16) and 10-30x *slower* on an AMD EPYC Zen 3 (AVX2 only, bf16 emulated), Inception
v3 training at 80 px (2026-11-24). GPUs spread the same way (sources in the tables).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import math
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from inceptionlab import queueing
from inceptionlab.fileio import atomic_write_json

log = logging.getLogger(__name__)

AUTO = "auto"
# INCEPTIONLAB_AUTO=safe: `auto` means fp32, NCHW, eager without probing or timing (figures comparable
# across machines; the test suite runs so). Unset or `measure`: probe and calibrate.
AUTO_ENV = "INCEPTIONLAB_AUTO"

# A candidate must run at least this much faster than the safe configuration to be chosen: smaller
# gains are within the run-to-run noise of a 2-core CPU (identical runs drifted 5-10% there).
CLEAR_MARGIN = 1.10
# Calibration time bound per decision, and per candidate at most its share of it.
CALIBRATION_BUDGET_S = 20.0
MIN_TIMED_STEPS = 2
MAX_TIMED_STEPS = 5


# =========================================================================== what the device is


@dataclass(frozen=True)
class DeviceFacts:
    """What the probe knows about one device, without timing anything.

    kind: cpu | cuda (NVIDIA) | rocm (AMD). arch: the CPU's ATen capability (AVX2, AVX512, ...), an
    NVIDIA compute capability as "sm_80", or an AMD gfx target as "gfx90a".
    """

    kind: str
    name: str
    arch: str
    bf16: bool  # native bf16 arithmetic (CPU: oneDNN's check; GPU: the tables below)
    fp16: bool  # fp16 worth training in (tensor/matrix cores and fast kernels)
    amx: bool = False
    tf32: bool = False
    notes: tuple[str, ...] = ()

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("cuda", "rocm")

    def describe(self) -> str:
        units = [name for name, has in (("bf16", self.bf16), ("fp16", self.fp16), ("AMX", self.amx),
                                        ("TF32", self.tf32)) if has]
        return f"{self.name} ({self.arch}; {', '.join(units) or 'fp32 only'})"


def cpu_facts() -> DeviceFacts:
    """The CPU as torch's kernels will use it.

    bf16/fp16 come from oneDNN's own check (`torch.ops.mkldnn._is_mkldnn_bf16_supported`), which
    also honours ONEDNN_MAX_CPU_ISA: a CPU limited to AVX2 that way reports no bf16, as it should.
    """
    import torch  # start-up time: callers that only need the name (loadtest) never pay for torch

    from inceptionlab.host import cpu_flags, cpu_model_name

    capability = _cpu_capability(torch)
    bf16 = _mkldnn_supports(torch, "bf16")
    flags = cpu_flags()
    amx = bf16 and "amx_bf16" in flags
    return DeviceFacts("cpu", cpu_model_name(), capability, bf16=bf16, fp16=False, amx=amx)


def _cpu_capability(torch: Any) -> str:
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # older torch or an exotic platform
        return platform.machine() or "unknown"


def _mkldnn_supports(torch: Any, what: str) -> bool:
    check = getattr(torch.ops.mkldnn, f"_is_mkldnn_{what}_supported", None)
    try:
        return bool(check()) if check is not None else False
    except Exception:  # a build without oneDNN
        return False


# --- GPUs: what each architecture has units for. One row per fact, with its source.

# NVIDIA compute capability (major, minor) from which a feature exists.
NVIDIA_BF16_FROM = (8, 0)  # bf16 tensor cores: Ampere (A100 whitepaper); T4 (7.5) and V100 (7.0) have none
NVIDIA_FP16_FROM = (7, 0)  # fp16 tensor cores: Volta; fp16 + GradScaler is the fast path on sm_70/sm_75
NVIDIA_TF32_FROM = (8, 0)  # TF32 exists from Ampere on (torch docs, "TensorFloat-32 (TF32) on Ampere")

# AMD gfx targets with bf16 matrix units. gfx90a (MI200), gfx94x (MI300), gfx95x (MI350): CDNA2+
# matrix cores (AMD CDNA2/CDNA3 ISA guides); gfx11/gfx12 (RDNA3/4): WMMA bf16 (RDNA3 ISA guide),
# kept as candidates to be measured, never assumed fast.
AMD_BF16_PREFIXES = ("gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")
# fp16 convolutions on MI250X (gfx90a) fall back to naive kernels 6.4x slower than A100 (ROCm/MIOpen#3310).
AMD_FP16_SLOW_PREFIXES = ("gfx90a",)
# channels_last: 1.3-2x faster on MI300X, badly regressed on Radeon gfx11 since ROCm 7
# (pytorch/pytorch#170947). It stays a candidate everywhere, chosen only where measured faster; where
# nothing is measured (no calibration) RDNA gets NCHW.
AMD_NHWC_UNPROVEN_PREFIXES = ("gfx10", "gfx11", "gfx12")


def gpu_facts_from(name: str, vendor: str, major: int = 0, minor: int = 0, gfx: str | None = None) -> DeviceFacts:
    """DeviceFacts of a GPU from its properties: testable with fake devices (any vendor, any arch)."""
    if vendor == "rocm":
        arch = (gfx or "gfx?").split(":")[0]  # "gfx90a:sramecc+:xnack-" -> "gfx90a"
        bf16 = arch.startswith(AMD_BF16_PREFIXES)
        fp16 = not arch.startswith(AMD_FP16_SLOW_PREFIXES)
        notes = ("fp16 convolutions use slow fallback kernels here (ROCm/MIOpen#3310)",) if not fp16 else ()
        return DeviceFacts("rocm", name, arch, bf16=bf16, fp16=fp16, notes=notes)
    capability = (major, minor)
    return DeviceFacts("cuda", name, f"sm_{major}{minor}", bf16=capability >= NVIDIA_BF16_FROM,
                       fp16=capability >= NVIDIA_FP16_FROM, tf32=capability >= NVIDIA_TF32_FROM)


def gpu_facts(index: int = 0) -> DeviceFacts:
    import torch

    props = torch.cuda.get_device_properties(index)
    if getattr(torch.version, "hip", None):
        return gpu_facts_from(props.name, "rocm", gfx=getattr(props, "gcnArchName", None))
    return gpu_facts_from(props.name, "cuda", props.major, props.minor)


def device_facts(device: Any) -> DeviceFacts:
    """Facts for a torch.device (or its name): the CPU's, or GPU index N's."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return gpu_facts(device.index if device.index is not None else torch.cuda.current_device())
    return cpu_facts()


# =========================================================================== candidates


@dataclass(frozen=True)
class Candidate:
    """One speed configuration: a precision, a memory format and whether to torch.compile."""

    precision: str = "fp32"
    channels_last: bool = False
    compile: bool = False

    @property
    def label(self) -> str:
        parts = [self.precision, "channels_last" if self.channels_last else "nchw"]
        return " ".join(parts + (["compile"] if self.compile else []))

    @classmethod
    def from_label(cls, label: str) -> Candidate:
        parts = label.split()
        return cls(parts[0], parts[1] == "channels_last", "compile" in parts[2:])


SAFE = Candidate()


@dataclass(frozen=True)
class Wanted:
    """What the user asked for: a fixed value per dimension, or AUTO."""

    precision: str = AUTO
    channels_last: bool | str = AUTO
    compile: bool | str = AUTO


def precision_options(facts: DeviceFacts, training: bool) -> tuple[list[str], dict[str, str]]:
    """(precisions worth measuring, {precision: why not}) for this device."""
    options, ruled_out = ["fp32"], {}
    if facts.bf16:
        options.append("bf16")
    else:
        ruled_out["bf16"] = _no_bf16_reason(facts)
    if facts.kind == "cpu":
        pass  # fp16 autocast on a CPU pays only on AMX-FP16 parts, for inference: never an auto candidate
    elif facts.fp16 and not (facts.bf16 and training):
        # Where bf16 exists it is preferred for training: fp32's range, no loss scaling.
        options.append("fp16")
    elif not facts.fp16:
        ruled_out["fp16"] = "; ".join(facts.notes) or f"{facts.arch} has no fp16 matrix units"
    return options, ruled_out


def _no_bf16_reason(facts: DeviceFacts) -> str:
    if facts.kind == "cpu":
        return (f"this CPU ({facts.arch}) has no bf16 units as oneDNN reports: bf16 would be emulated, "
                "10-30x slower than fp32 (AMD EPYC Zen 3)")
    if facts.kind == "cuda":
        return f"{facts.arch} has no bf16 tensor cores (sm_80 and later do): fp16 with loss scaling is its fast path"
    return f"{facts.arch} has no bf16 matrix units"


def layout_options(facts: DeviceFacts, env: Mapping[str, str]) -> tuple[list[bool], str | None]:
    """(memory formats worth measuring, a reason when one is forced or dropped)."""
    if facts.kind == "rocm":
        suggested = env.get("PYTORCH_MIOPEN_SUGGEST_NHWC")
        if suggested is not None:  # the user's own MIOpen setting decides the layout
            on = suggested.strip().lower() in ("1", "true", "yes", "on")
            return [on], f"PYTORCH_MIOPEN_SUGGEST_NHWC={suggested} set by the user"
    return [False, True], None


def compile_options(facts: DeviceFacts, training: bool) -> tuple[list[bool], str]:
    """torch.compile is decided by the probe alone: timing it would cost its own compile (tens of
    seconds to minutes for Inception v3), above the calibration bound.

    Off on CPUs (inductor's CPU training kernels gained nothing over oneDNN in our runs and the
    compile takes minutes on 2 cores), off on ROCm (can be slower than eager: pytorch/pytorch#187065),
    on NVIDIA GPUs from sm_70 for long runs only (`long_run`, decided by the caller).
    """
    if facts.kind == "cuda" and facts.fp16:
        return [False, True], "torch.compile pays on NVIDIA GPUs when the run is long enough to amortise the compile"
    if facts.kind == "rocm":
        return [False], "torch.compile can be slower than eager on ROCm (pytorch/pytorch#187065)"
    return [False], "torch.compile costs minutes on a CPU and oneDNN's eager kernels are as fast"


def plan_candidates(facts: DeviceFacts, wanted: Wanted, *, training: bool, long_run: bool = False,
                    env: Mapping[str, str] | None = None) -> tuple[list[Candidate], dict[str, str]]:
    """Every candidate the probe allows for the AUTO dimensions (fixed ones pinned); SAFE-like first.

    Returns (candidates, {what: why it was ruled out or forced}).
    """
    if auto_is_safe(env):
        return [_safe_for(wanted)], {"auto": f"{AUTO_ENV}=safe: fp32, NCHW, eager wherever not set"}
    env = os.environ if env is None else env
    reasons: dict[str, str] = {}
    if wanted.precision == AUTO:
        precisions, ruled_out = precision_options(facts, training)
        reasons.update(ruled_out)
    else:
        precisions = [wanted.precision]
    if wanted.channels_last == AUTO:
        layouts, why = layout_options(facts, env)
        if why:
            reasons["layout"] = why
    else:
        layouts = [bool(wanted.channels_last)]
    if wanted.compile == AUTO:
        compiles, why = compile_options(facts, training)
        if not long_run and True in compiles:
            compiles, why = [False], "torch.compile: the run is too short to amortise the compile"
        reasons["compile"] = why
    else:
        compiles = [bool(wanted.compile)]
    candidates = [Candidate(p, cl, c) for p in precisions for cl in layouts for c in compiles]
    return candidates, reasons


def auto_is_safe(env: Mapping[str, str] | None = None) -> bool:
    """INCEPTIONLAB_AUTO=safe: `auto` is fp32, NCHW, eager, one serving instance; nothing is timed."""
    return (os.environ if env is None else env).get(AUTO_ENV, "").strip().lower() == "safe"


def _safe_for(wanted: Wanted) -> Candidate:
    pick = lambda value, safe: safe if value == AUTO else value  # noqa: E731
    return Candidate(pick(wanted.precision, "fp32"), bool(pick(wanted.channels_last, False)),
                     bool(pick(wanted.compile, False)))


def baseline_of(candidates: list[Candidate]) -> Candidate:
    """The safe candidate among these: fp32, NCHW, eager where allowed, else the first."""
    ranked = sorted(candidates, key=lambda c: (c.precision != "fp32", c.channels_last, c.compile))
    return ranked[0]


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


# =========================================================================== emulation warning


def emulation_warning(facts: DeviceFacts, precision: str, measure: bool = True) -> str | None:
    """A one-line warning when `precision` can only be emulated here, with the slowdown to expect.

    On a CPU the slowdown is measured at once on one convolution (64 channels, 40x40, batch 8, channels
    last: 0.05-0.3 s): 6.6-10.5x on an AMD EPYC capped to AVX2, against 0.5x (faster) with bf16 units.
    """
    if precision != "bf16" or facts.bf16:
        return None
    if facts.kind != "cpu":
        return f"bf16: {_no_bf16_reason(facts)}"
    factor = conv_slowdown("bf16") if measure else None
    expected = f"{factor:.1f}x slower than fp32 on one convolution here" if factor else "10-30x slower than fp32"
    return (f"bf16 is emulated on this CPU ({facts.name}, {facts.arch}: no avx512_bf16/amx_bf16 units as oneDNN "
            f"reports): expect it {expected}; whole models measured 6-34x slower on such a CPU")


def conv_slowdown(precision: str, repeats: int = 3) -> float | None:
    """Seconds of one conv under `precision` autocast over fp32 seconds, on the CPU (None on failure)."""
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    conv = torch.nn.Conv2d(64, 64, 3, padding=1).to(memory_format=torch.channels_last)
    x = torch.randn(8, 64, 40, 40).contiguous(memory_format=torch.channels_last)

    def run(enabled: bool) -> float:
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=enabled):
            conv(x)
            start = time.perf_counter()
            for _ in range(repeats):
                conv(x)
            return time.perf_counter() - start

    try:
        return run(True) / run(False)
    except Exception:
        log.debug("conv slowdown probe failed", exc_info=True)
        return None


# =========================================================================== the cache


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """$INCEPTIONLAB_CACHE, else $XDG_CACHE_HOME/inceptionlab, else ~/.cache/inceptionlab."""
    env = os.environ if env is None else env
    if env.get("INCEPTIONLAB_CACHE"):
        return Path(env["INCEPTIONLAB_CACHE"])
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inceptionlab"


@dataclass(frozen=True)
class CacheKey:
    """Everything a measured speed depends on. A change in any field means measuring again."""

    purpose: str  # train | infer
    device: str  # cpu | cuda | rocm
    device_name: str
    arch: str
    bf16: bool
    torch: str
    model: str
    input_shape: tuple[int, ...]
    batch: int
    threads: int
    extra: str = ""  # e.g. the runtime for inference decisions

    def digest(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:20]


def make_key(purpose: str, facts: DeviceFacts, model: str, input_shape: Iterable[int], batch: int,
             threads: int | None = None, extra: str = "") -> CacheKey:
    import torch

    threads = torch.get_num_threads() if threads is None else threads
    return CacheKey(purpose, facts.kind, facts.name, facts.arch, facts.bf16, torch.__version__, model,
                    tuple(int(x) for x in input_shape), int(batch), 0 if facts.is_gpu else int(threads), extra)


@dataclass
class SpeedCache:
    """Measured images/s per candidate, one JSON file per key (atomic writes: parallel runs never
    corrupt it, a later writer only adds figures)."""

    root: Path = field(default_factory=lambda: cache_root() / "speed")

    def path(self, key: CacheKey) -> Path:
        return self.root / f"{key.purpose}-{key.digest()}.json"

    def load(self, key: CacheKey) -> dict[str, float]:
        path = self.path(key)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            log.warning("ignoring unreadable speed cache %s", path, exc_info=True)
            return {}
        if data.get("key") != _key_dict(key):  # a hash collision or an edited file: measure again
            return {}
        return {label: float(v) for label, v in data.get("img_per_s", {}).items()}

    def store(self, key: CacheKey, measured: Mapping[str, float]) -> None:
        figures = {**self.load(key), **measured}
        try:
            atomic_write_json(self.path(key), {"key": _key_dict(key), "img_per_s": figures,
                                               "time": time.strftime("%Y-%m-%dT%H:%M:%S")})
        except OSError:  # a read-only home: decide again next time, but say so once
            log.warning("could not write the speed cache under %s", self.root, exc_info=True)

    def entries(self) -> Iterator[dict[str, Any]]:
        for path in sorted(self.root.glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                yield json.loads(path.read_text())


def _key_dict(key: CacheKey) -> dict[str, Any]:
    data = asdict(key)
    data["input_shape"] = list(key.input_shape)
    return data


# =========================================================================== calibration


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


# =========================================================================== serving


# A serving plan is chosen for the highest Poisson rate that holds a latency objective (--slo-ms, p99),
# simulated from each plan's measured batch times (queueing.py). Plans within this factor of the best
# rate count as equal, and the one with the lowest latency at a light load wins among them: on a
# 2-core AMD EPYC (demo model, OpenVINO bf16), 1 instance x 2 threads answered at p50 8-9 ms where 2 x 1
# thread took 12-14 ms at the same rates. Saturation (a closed loop of full batches), the figure
# measured, favours big batches that random arrivals rarely fill.
SLO_RATE_MARGIN = 1.1
DEFAULT_SLO_MS = 100.0  # a person waiting on an answer; the serving benchmark's objective too
LIGHT_LOAD = 0.2  # of the best plan's rate, where "latency at a light load" is compared
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


def auto_delay_ms(plan: ServePlan, single_img_per_s: float | None) -> float:
    """How long a request may wait for a batch to fill: 10% of one unbatched inference, 1-10 ms (a
    fuller batch is worth at most that much of a lone request's latency); 0 when unbatched."""
    if plan.max_batch == 1 or not single_img_per_s:
        return 0.0
    return round(min(10.0, max(1.0, 100.0 / single_img_per_s)), 1)


def plan_delay_ms(plan: ServePlan, figures: Mapping[str, float], delay_ms: float | None) -> float:
    """--max-delay-ms as set, else `auto_delay_ms` from one stream's images/s (1 / batch-1 latency)."""
    if delay_ms is not None:
        return delay_ms
    unbatched = figures.get(ServePlan(plan.instances, 1).label)
    return auto_delay_ms(plan, unbatched / plan.instances if unbatched else None)


@dataclass(frozen=True)
class PlanLatency:
    """What the simulation says of one plan: its highest rate within the SLO, its p50 at a light load."""

    rate: float  # requests/s (Poisson) holding p99 <= SLO; 0: not even a lone request does
    light_p50_ms: float


def simulate_plans(plans: list[ServePlan], figures: Mapping[str, float], slo_ms: float,
                   delay_ms: float | None) -> dict[str, PlanLatency]:
    """Each plan with measured batch times, through queueing.py at the SLO."""
    times = {p.label: t for p in plans if (t := batch_times(p, figures)) is not None}
    rates = {p.label: queueing.slo_rate(p.instances, times[p.label], plan_delay_ms(p, figures, delay_ms) / 1e3,
                                        slo_ms / 1e3) for p in plans if p.label in times}
    light = max(LIGHT_LOAD * max(rates.values(), default=0.0), queueing.LONE)
    return {p.label: PlanLatency(round(rates[p.label], 1), round(1e3 * queueing.latency_at(
        light, p.instances, times[p.label], plan_delay_ms(p, figures, delay_ms) / 1e3, 50.0), 2))
        for p in plans if p.label in rates}


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
    slo_ms: float = DEFAULT_SLO_MS
    latency: dict[str, PlanLatency] = field(default_factory=dict)

    def line(self) -> str:
        how = {"measured": f"measured in {self.seconds:.1f} s", "cached": "cached measurement", "probe": "as set",
               "pinned": "as set"}[self.source]
        threads = f", {self.threads} thread(s) each" if self.threads else ""
        return (f"serving plan: {self.plan.instances} instance(s){threads}, max batch {self.plan.max_batch}, "
                f"max delay {self.max_delay_ms:g} ms ({how}{self._evidence()})")

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
        return (f"; highest Poisson rate holding p99 <= {self.slo_ms:g} ms, simulated from batch times: {held}; "
                f"saturation img/s: {saturation}")


def decide_serving(plans: list[ServePlan], measure: Callable[[ServePlan, float], float | None] | None, *,
                   cpus: int, gpu: bool, key: CacheKey | None = None, cache: SpeedCache | None = None,
                   fresh: bool = False, delay_ms: float | None = None, slo_ms: float = DEFAULT_SLO_MS,
                   clock: Callable[[], float] = time.perf_counter) -> ServeDecision:
    """Measure (or recall) each plan's saturation images/s, simulate each under Poisson arrivals at the
    SLO, and pick one (`pick_plan`); the delay follows the plan. A single plan (all set by the user)
    is kept; only its delay may need its batch-1 figure."""
    started = clock()
    if len(plans) == 1:
        figures, source = {}, "pinned"
        if delay_ms is None and plans[0].max_batch > 1 and measure is not None:
            figures, source = measured_figures([ServePlan(plans[0].instances, 1)], measure, key, cache, fresh,
                                               SERVE_BUDGET_S, {}, clock)
        choice, latency = plans[0], {}
    else:
        figures, source = measured_figures(measured_plans(plans), measure, key, cache, fresh, SERVE_BUDGET_S, {},
                                           clock)
        latency = simulate_plans(plans, figures, slo_ms, delay_ms)
        choice = pick_plan(plans, latency, figures)
    threads = None if gpu else instance_threads(cpus, choice.instances)
    return ServeDecision(choice, plan_delay_ms(choice, figures, delay_ms), figures, source, clock() - started,
                         threads, slo_ms, latency)


# =========================================================================== threads


def usable_cpus(affinity: Callable[[], set[int]] | None = None, quota: Callable[[], float | None] | None = None) -> int:
    """CPUs this process may actually use: its affinity mask, capped by a cgroup CPU quota."""
    try:
        count = len((affinity or (lambda: os.sched_getaffinity(0)))())
    except (AttributeError, OSError):  # no sched_getaffinity (macOS, Windows)
        count = os.cpu_count() or 1
    limit = (quota or cgroup_cpu_quota)()
    if limit is not None:
        count = min(count, max(1, math.ceil(limit)))
    return max(1, count)


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs allowed by the cgroup (v2 cpu.max, or v1 cfs quota/period); None when unlimited."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us


@dataclass(frozen=True)
class CpuSample:
    """CPU-seconds spent so far: by every process on our CPUs (`busy`) and by this process tree (`own`)."""

    busy: float
    own: float
    wall: float


def cpu_sample(cpus: Iterable[int] | None = None, stat: Path = Path("/proc/stat")) -> CpuSample | None:
    """A snapshot of /proc/stat's busy time on `cpus` (default: our affinity) and our own CPU time.

    Busy is user + nice + system + irq + softirq + steal (a hypervisor's steal is as lost to us as
    another process's time). Own is this process's threads (process_time) plus its live children
    (DataLoader workers), from /proc. None where /proc/stat does not exist.
    """
    try:
        allowed = {f"cpu{n}" for n in (cpus if cpus is not None else os.sched_getaffinity(0))}
        lines = stat.read_text().splitlines()
    except (OSError, AttributeError):
        return None
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy = 0
    for line in lines:
        fields = line.split()
        if fields and fields[0] in allowed:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
            busy += user + nice + system + irq + softirq + steal
    return CpuSample(busy / tick, time.process_time() + _children_cpu_seconds(tick), time.monotonic())


def _children_cpu_seconds(tick: int) -> float:
    total = 0.0
    for children in Path("/proc/self/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):
            for pid in children.read_text().split():
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


class ThreadGovernor:
    """torch's CPU thread count follows the CPUs that other processes leave free.

    OpenMP splits every operator evenly over its threads and waits for the slowest: a thread that
    shares its core with another busy process makes each operator wait for that process's time slice.
    On 2 cores with one busy process beside it, the demo's epoch fell from 72 to 14-16 img/s with 2
    threads (AMD EPYC, 2026-11-24); one thread on the free core loses only the second core's share.
    So: threads = CPUs we may use minus what others used since the last check (rounded), at least 1,
    re-checked before each training step but at most every `min_interval_s`: checking only at log
    intervals left the demo's first epoch at 35 img/s for its first 20 steps beside a busy process,
    against 71 once it had switched (AMD EPYC, 2 cores, 2026-11-25). A user's OMP_NUM_THREADS or
    train.threads fixes the count instead.
    """

    def __init__(self, limit: int, *, sample: Callable[[], CpuSample | None] = cpu_sample,
                 set_threads: Callable[[int], None] | None = None, say: Callable[[str], None] | None = None,
                 fixed: bool = False, min_interval_s: float = 2.0, clock: Callable[[], float] = time.monotonic):
        import torch

        self.limit, self.fixed, self.min_interval_s, self.clock = max(1, limit), fixed, min_interval_s, clock
        self.sampled_at = clock()
        self.sample, self.say = sample, say
        self.set_threads = set_threads or torch.set_num_threads
        self.threads = self.limit
        self.set_threads(self.threads)
        self.last = None if fixed else sample()
        self.changes = 0

    def describe(self) -> str:
        how = "fixed" if self.fixed else "fewer while other processes keep CPUs busy"
        return f"threads: {self.threads} ({how})"

    def others(self) -> float | None:
        """CPUs' worth of time other processes used since the last call (None: unknown)."""
        now = self.sample()
        before, self.last = self.last, now
        if now is None or before is None or now.wall - before.wall < 0.05:
            return None
        elapsed = now.wall - before.wall
        return max(0.0, ((now.busy - before.busy) - (now.own - before.own)) / elapsed)

    def update(self, *_: Any) -> int:
        """Re-size torch's pool for the load seen since the last call; returns the thread count."""
        if self.fixed:
            return self.threads
        if self.clock() - self.sampled_at < self.min_interval_s:
            return self.threads  # a window this short says little, and /proc reads cost time
        self.sampled_at = self.clock()
        others = self.others()
        if others is None:
            return self.threads
        target = min(self.limit, max(1, round(self.limit - others)))
        if target != self.threads:
            self.changes += 1
            if self.say is not None:
                self.say(f"threads: {self.threads} -> {target} (other processes used {others:.1f} of "
                         f"{self.limit} CPUs since the last check)")
            self.threads = target
            self.set_threads(target)
        return self.threads


def thread_limit(requested: int | None, env: Mapping[str, str] | None = None) -> tuple[int, bool]:
    """(threads, fixed): train.threads or OMP_NUM_THREADS fix the count; else the usable CPUs, governed."""
    env = os.environ if env is None else env
    if requested:
        return requested, True
    omp = env.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) > 0:
        return int(omp), True
    return usable_cpus(), False


# =========================================================================== GPU process settings


def cudnn_benchmark(facts: DeviceFacts) -> bool:
    """cuDNN's autotuner on NVIDIA (fixed shapes); off on ROCm, where it makes MIOpen run an
    exhaustive search for every new shape (ROCm/pytorch#1851)."""
    return facts.kind == "cuda"


@contextlib.contextmanager
def gpu_settings(facts: DeviceFacts, precision: str, deterministic: bool = False) -> Iterator[None]:
    """cudnn.benchmark and TF32 for one run, restored afterwards (they are process-wide flags).

    TF32 for fp32 training on sm_80+ (10-bit mantissa in the matmul units, fp32 range): torch's
    default is IEEE fp32 for matmuls, which leaves Ampere's tensor cores idle.
    """
    import torch

    if not facts.is_gpu:
        yield
        return
    benchmark = cudnn_benchmark(facts) and not deterministic
    matmul = torch.backends.cuda.matmul
    saved_tf32 = matmul.allow_tf32
    try:
        with torch.backends.cudnn.flags(enabled=True, benchmark=benchmark, deterministic=deterministic,
                                        allow_tf32=facts.tf32 and precision == "fp32" and not deterministic):
            matmul.allow_tf32 = facts.tf32 and precision == "fp32" and not deterministic
            yield
    finally:
        matmul.allow_tf32 = saved_tf32


# MIOpen keeps its find-database and compiled kernels under ~/.config/miopen and ~/.cache/miopen by
# default: NFS homes, read-only homes and parallel jobs writing one file corrupt them, and a ROCm
# upgrade reads the old version's kernels. One persistent, writable, per-user folder per ROCm version.
MIOPEN_VARS = ("MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR")


def rocm_build_tag(torch_version: str | None = None) -> str | None:
    """'rocm6.2' from torch's version string ('2.5.1+rocm6.2'), read without importing torch."""
    if torch_version is None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            torch_version = version("torch")
        except PackageNotFoundError:
            return None
    local = torch_version.partition("+")[2]
    return local if local.startswith("rocm") else None


def miopen_environment(env: Mapping[str, str], torch_version: str | None = None) -> dict[str, str]:
    """The MIOpen variables to set before torch is imported: none on non-ROCm builds, none the user set."""
    tag = rocm_build_tag(torch_version)
    if tag is None or any(var in env for var in MIOPEN_VARS):
        return {}
    home = cache_root(env) / "miopen" / tag
    return {"MIOPEN_USER_DB_PATH": str(home / "db"), "MIOPEN_CUSTOM_CACHE_DIR": str(home / "kernels")}


def prepare_process_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """Set what must be set before torch is imported (the CLI calls this first); returns what it set."""
    env = os.environ if env is None else env  # type: ignore[assignment]
    chosen = miopen_environment(env)
    for name, path in chosen.items():
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
        except OSError:  # not writable: leave MIOpen on its defaults
            log.warning("cannot create %s for %s; MIOpen keeps its default", path, name)
            return {}
    env.update(chosen)
    return chosen


def replace_choice(decision: Decision, **changes: Any) -> Decision:
    return replace(decision, choice=replace(decision.choice, **changes))
