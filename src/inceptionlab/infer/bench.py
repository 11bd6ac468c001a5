"""Inference benchmark: warm-up, synchronised timing, first call apart, percentiles, environment.

For every batch size, every configuration (backend x precision x layout):

1. open a session (`setup_ms`: load, optimise, compile an engine; quantization is done before,
   once, and cached);
2. time the first call alone (`first_ms`: torch.compile compiles here, oneDNN creates kernels);
3. `warmup` untimed calls; then `iters` timed calls, each ending with the device synchronised, in
   ROUNDS rounds in which the configurations take turns (drift beside the bench falls on every row
   alike), with Python's garbage collector paused (as `timeit` does);
4. report mean/p50/p90/p99 latency, images/s from the median (the mean's too) and the GFLOP/s that
   achieves; how far the rounds' medians spread (`spread`; over SPREAD_LIMIT: `unsteady`), and other
   processes' CPU use while the row's calls ran (`others_cpus`, sampled as the thread governor samples
   it; over BUSY_CPUS: the row says `machine_busy`, and the output warns).

With `--tta` a configuration also runs with test-time augmentation: each call makes every view of its
batch (models/tta.py), runs the model on each and averages the logits, as `serve --tta` does, so the
speed-up column against plain eager fp32 is TTA's cost.

Reduced precisions (bf16, fp16, int8) are also run on held-out real images and compared with fp32
PyTorch: `agreement` (top-1) and `usable` (quantize.MIN_AGREEMENT on >= MIN_HOLDOUT_IMAGES).
Several configurations in one call get a speed-up column against eager fp32 NCHW (always measured
first). Every row is appended to bench/results.jsonl with the command, versions, device and settings.
"""

from __future__ import annotations

import copy
import gc
import logging
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator

import numpy as np
import torch

from inceptionlab import hardware
from inceptionlab.errors import UserError
from inceptionlab.host import load_average
from inceptionlab.infer.inputs import image_files, random_inputs
from inceptionlab.infer.parity import torch_logits
from inceptionlab.infer.quantize import (
    CALIBRATION_IMAGES,
    MIN_AGREEMENT,
    MIN_HOLDOUT_IMAGES,
    ImageSets,
    Verdict,
    image_sets,
    judge,
)
from inceptionlab.infer.runtimes import (
    NATIVE_LAYOUT,
    REDUCED_PRECISIONS,
    TORCH_LAYOUTS,
    Artifacts,
    RuntimeSession,
    Target,
    Unsupported,
    get_runtime,
)
from inceptionlab.infer.source import ModelSource
from inceptionlab.models.tta import iter_views

log = logging.getLogger(__name__)

ROW_KEYS = ("backend", "precision", "layout", "tta", "batch", "provider", "setup_ms", "first_ms", "mean_ms", "p50_ms",
            "p90_ms", "p99_ms", "img_per_s", "img_per_s_mean", "gflop_per_image", "gflops", "speedup", "spread",
            "unsteady", "others_cpus", "machine_busy", "agreement", "usable")


@dataclass(frozen=True)
class Config:
    backend: str
    precision: str
    layout: str
    tta: str = "none"  # test-time augmentation around every call (AugmentedSession)

    @property
    def label(self) -> str:
        layout = "" if self.layout in (NATIVE_LAYOUT, "nchw") else f" {self.layout}"
        tta = "" if self.tta == "none" else f" tta {self.tta}"
        return f"{self.backend} {self.precision}{layout}{tta}"


class AugmentedSession(RuntimeSession):
    """A session that runs every TTA view of its batch and averages the logits (what serve --tta does per
    batch): the views are made, placed and run inside the timed call."""

    def __init__(self, inner: RuntimeSession, mode: str):
        self.inner, self.mode = inner, mode
        self.provider, self.batch = inner.provider, inner.batch

    def place(self, inputs: np.ndarray) -> Any:
        return inputs

    def run(self, placed: Any) -> Any:
        return [self.inner.run(self.inner.place(np.ascontiguousarray(view.numpy())))
                for view in iter_views(torch.from_numpy(placed), self.mode)]

    def to_numpy(self, output: Any) -> np.ndarray:
        return np.mean([self.inner.to_numpy(o) for o in output], axis=0)


BASELINE = Config("eager", "fp32", "nchw")


def parse_list(text: str, allowed: tuple[str, ...] | None, option: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise UserError(f"{option}: give at least one value")
    bad = [item for item in items if allowed is not None and item not in allowed]
    if bad:
        raise UserError(f"{option} {','.join(bad)}: use a comma list of {', '.join(allowed or ())}")
    return list(dict.fromkeys(items))


def parse_batches(text: str) -> list[int]:
    try:
        batches = [int(item) for item in parse_list(text, None, "--batch")]
    except ValueError:
        raise UserError(f"--batch {text}: use a comma list of positive integers, e.g. 1,8,32") from None
    if any(b < 1 for b in batches):
        raise UserError(f"--batch {text}: batch sizes must be >= 1")
    return batches


def auto_precisions(facts: hardware.DeviceFacts) -> tuple[list[str], dict[str, str]]:
    """`--precision auto`: fp32 and each reduced float precision this device has units for.

    int8 needs calibration images and an agreement check: it is measured when named, never by auto.
    """
    if hardware.auto_is_safe():
        return ["fp32"], {"auto": f"{hardware.AUTO_ENV}=safe"}
    return hardware.precision_options(facts, training=False)


def plan(backends: list[str], precisions: list[str], layouts: list[str],
         facts: hardware.DeviceFacts | None = None, ttas: list[str] | None = None) -> list[Config]:
    """Every backend x precision (x layout for PyTorch backends) x TTA mode; eager fp32 NCHW without TTA
    first when comparing.

    `auto` in `precisions` stands for `auto_precisions(facts)`; `auto` in `layouts` for both layouts.
    """
    named = [p for p in precisions if p != "auto"]
    found: list[str] = []
    if "auto" in precisions:
        found, _ = auto_precisions(facts or hardware.cpu_facts())
    if "auto" in layouts:
        auto_layouts = ["nchw"] if hardware.auto_is_safe() else list(TORCH_LAYOUTS)
        layouts = [layout for layout in layouts if layout != "auto"] + auto_layouts
    precisions, layouts = list(dict.fromkeys(named + found)), list(dict.fromkeys(layouts))
    configs = []
    for backend in backends:
        runtime = get_runtime(backend)
        for precision in precisions:
            if precision not in named and precision not in runtime.precisions:
                continue  # auto asks each runtime only for what it has (ONNX Runtime has no bf16 path)
            for layout in (layouts if runtime.layouts == TORCH_LAYOUTS else [NATIVE_LAYOUT]):
                configs.extend(Config(backend, precision, layout, tta) for tta in ttas or ["none"])
    configs = list(dict.fromkeys(configs))
    if len(configs) > 1:  # a comparison: eager fp32 NCHW first, the reference for every speed-up
        if BASELINE in configs:
            configs.remove(BASELINE)
        configs.insert(0, BASELINE)
    return configs


# --------------------------------------------------------------------------------------- timing

# Rounds the timed calls of each batch size are split into. Within a round every configuration runs its
# share in turn (forward in even rounds, backward in odd ones), so a process that starts, stops or
# drifts beside the bench slows every row alike instead of the rows that happened to run then: run one
# after another beside a busy process, eager's rows slowed 10-30x and ONNX Runtime's did not, and the
# speed-up column read 131x, 40x and 3.7x in three runs (AMD EPYC, 2 cores, 2026-11-26).
ROUNDS = 5
# A row whose rounds' medians differ by more than this share of its median is flagged: its figure moved
# while it was measured (the quiet-machine repeatability asked of bench is within 10%).
SPREAD_LIMIT = 0.10
# Other processes' CPU use (CPUs' worth) from which the machine counts as busy: an idle Linux host's
# daemons use a few hundredths of a CPU; one busy loop uses 1.0.
BUSY_CPUS = 0.25


@dataclass
class Timing:
    setup_ms: float
    first_ms: float
    times_ms: list[float]
    round_medians_ms: list[float] = field(default_factory=list)
    others_cpus: float | None = None  # CPUs' worth other processes used while this row's calls ran

    def stats(self, batch: int) -> dict[str, float | None]:
        times = np.asarray(self.times_ms)
        mean, p50 = float(times.mean()), float(np.percentile(times, 50))
        return {
            "setup_ms": round(self.setup_ms, 2),
            "first_ms": round(self.first_ms, 3),
            "mean_ms": round(mean, 3),
            "std_ms": round(float(times.std()), 3),
            "min_ms": round(float(times.min()), 3),
            "p50_ms": round(p50, 3),
            "p90_ms": round(float(np.percentile(times, 90)), 3),
            "p99_ms": round(float(np.percentile(times, 99)), 3),
            # From the median, as the speed-up is: one slow call (a page fault, a neighbour's burst) moves
            # the mean, not the median. The mean's figure is kept beside it.
            "img_per_s": round(batch * 1000.0 / p50, 3),
            "img_per_s_mean": round(batch * 1000.0 / mean, 3),
            "rounds": len(self.round_medians_ms),
            "spread": round(self.spread, 4) if self.spread is not None else None,
            "others_cpus": None if self.others_cpus is None else round(self.others_cpus, 3),
        }

    @property
    def spread(self) -> float | None:
        """(slowest - fastest round median) / the row's median; None with fewer than two rounds."""
        if len(self.round_medians_ms) < 2:
            return None
        return (max(self.round_medians_ms) - min(self.round_medians_ms)) / float(np.median(self.times_ms))


@dataclass
class _Timed:
    """One open session being measured in rounds."""

    config: Config
    session: RuntimeSession
    placed: Any
    setup_ms: float
    first_ms: float = 0.0
    times_ms: list[float] = field(default_factory=list)
    round_medians_ms: list[float] = field(default_factory=list)
    other_cpu_s: float = 0.0
    wall_s: float = 0.0
    others_known: bool = True
    settings: Callable[[], ContextManager[Any]] = nullcontext  # its process-wide GPU flags, around each call

    def timing(self) -> Timing:
        others = self.other_cpu_s / self.wall_s if self.others_known and self.wall_s > 0 else None
        return Timing(self.setup_ms, self.first_ms, self.times_ms, self.round_medians_ms, others)


def round_sizes(iters: int, rounds: int) -> list[int]:
    """`iters` timed calls split over at most `rounds` rounds, as evenly as they go (the first get the rest)."""
    rounds = max(1, min(rounds, iters))
    return [iters // rounds + (1 if r < iters % rounds else 0) for r in range(rounds)]


def time_in_rounds(timed: list[_Timed], iters: int, warmup: int, rounds: int = ROUNDS,
                   clock: Callable[[], float] = time.perf_counter,
                   sample: Callable[[], hardware.CpuSample | None] = hardware.cpu_sample) -> None:
    """Each session's first call and warm-up, then its `iters` timed calls in rounds, the sessions taking
    turns (ROUNDS says why). Each turn starts with one untimed call (caches and thread pools warm again
    after the other sessions ran) and is bracketed by CPU samples: other processes' CPU use is charged to
    the row whose calls it overlapped. Python's garbage collector is paused while calls are timed (as
    `timeit` does)."""
    for row in timed:
        with row.settings():
            start = clock()
            row.session.run(row.placed)
            row.first_ms = (clock() - start) * 1e3
            for _ in range(warmup):
                row.session.run(row.placed)
    gc.collect()
    gc_was_on = gc.isenabled()
    gc.disable()  # a collection inside a timed call would be charged to the runtime
    try:
        for number, calls in enumerate(round_sizes(iters, rounds)):
            for row in (timed if number % 2 == 0 else reversed(timed)):
                with row.settings():
                    _one_turn(row, calls, clock, sample)
    finally:
        if gc_was_on:
            gc.enable()


def _one_turn(row: _Timed, calls: int, clock: Callable[[], float],
              sample: Callable[[], hardware.CpuSample | None]) -> None:
    row.session.run(row.placed)  # untimed: the previous turn was another session's
    before = sample()
    times = []
    for _ in range(calls):
        start = clock()
        row.session.run(row.placed)
        times.append((clock() - start) * 1e3)
    seconds = hardware.others_cpu_seconds(before, sample())
    if seconds is None:
        row.others_known = False
    else:
        row.other_cpu_s += seconds[0]
        row.wall_s += seconds[1]
    row.times_ms.extend(times)
    row.round_medians_ms.append(float(np.median(times)))


def gflop_per_image(model: torch.nn.Module, input_shape: tuple[int, int, int]) -> float | None:
    """Forward FLOPs per image (a multiply-add counts 2), counted on meta tensors: no compute.
    Inception v3 at 299 px: 11.4 GFLOP (5.7 GMACs). None for a model the counter cannot trace."""
    from torch.utils.flop_counter import FlopCounterMode  # only when counting FLOPs

    try:
        meta = copy.deepcopy(model).to("meta").eval()
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            meta(torch.empty(1, *input_shape, device="meta"))
    except Exception:  # an op without a meta kernel: report no GFLOP/s rather than fail the bench
        log.info("no FLOP count for this model: the counter could not trace it", exc_info=True)
        return None
    return round(counter.get_total_flops() / 1e9, 3)


# --------------------------------------------------------------------------------------- the run


@dataclass
class BenchSettings:
    batches: list[int]
    iters: int = 100
    warmup: int = 10
    target: Target = field(default_factory=Target)
    calib_images: list[Path] = field(default_factory=list)
    holdout_images: list[Path] = field(default_factory=list)  # empty: held out from calib_images
    holdout: int = MIN_HOLDOUT_IMAGES
    calibration: int = CALIBRATION_IMAGES
    min_agreement: float = MIN_AGREEMENT
    onnx: Path | None = None
    rounds: int = ROUNDS

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["target"] = asdict(self.target)
        data["calib_images"] = [str(p) for p in self.calib_images]
        data["holdout_images"] = [str(p) for p in self.holdout_images]
        data["onnx"] = str(self.onnx) if self.onnx else None
        return data


@dataclass
class Skipped:
    config: Config
    reason: str


@dataclass
class BenchReport:
    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    verdicts: dict[Config, Verdict] = field(default_factory=dict)
    sets: ImageSets | None = None
    others_cpus: float | None = None  # other processes' CPU use over the whole measurement

    @property
    def busy(self) -> bool:
        figures = [r.get("others_cpus") for r in self.rows] + [self.others_cpus]
        return any(f is not None and f > BUSY_CPUS for f in figures)


class _Reference:
    """fp32 PyTorch logits on the held-out images, computed once, only if a reduced precision needs them."""

    def __init__(self, source: ModelSource, sets: ImageSets | None):
        self.source, self.sets = source, sets
        self._inputs: np.ndarray | None = None
        self._logits: np.ndarray | None = None

    def inputs(self) -> np.ndarray:
        if self._inputs is None:
            self._inputs = self.sets.holdout_inputs() if self.sets is not None else np.zeros((0, *self.source.spec.input_shape), np.float32)
        return self._inputs

    def logits(self) -> np.ndarray:
        if self._logits is None:
            self._logits = torch_logits(self.source.model, self.inputs())
        return self._logits


def run_bench(source: ModelSource, configs: list[Config], settings: BenchSettings,
              log: Callable[[str], None] = lambda message: None,
              on_rows: Callable[[list[dict[str, Any]]], None] = lambda rows: None,
              clock: Callable[[], float] = time.perf_counter,
              sample: Callable[[], hardware.CpuSample | None] = hardware.cpu_sample) -> BenchReport:
    """Measure every configuration at every batch size; `on_rows` gets each batch size's rows.

    Batch size by batch size: every configuration's session is opened, then all are timed in alternating
    rounds (`time_in_rounds`), then closed, so at most one session per configuration is alive at once."""
    report = BenchReport()
    if any(c.precision in REDUCED_PRECISIONS for c in configs):
        held = image_files(settings.holdout_images, source) if settings.holdout_images else None
        report.sets = image_sets(image_files(settings.calib_images or None, source), source.spec,
                                 settings.calibration, settings.holdout, held)
        log(f"agreement images: {report.sets.describe()}")
    artifacts = Artifacts(source, settings.calib_images or None, report.sets, settings.onnx, log)
    reference = _Reference(source, report.sets)
    context = {"gflop_per_image": gflop_per_image(source.model, source.spec.input_shape)}
    started = sample()
    for batch in settings.batches:
        timed = _open_sessions(configs, artifacts, settings, batch, report, log)
        if not timed:
            continue
        time_in_rounds(timed, settings.iters, settings.warmup, settings.rounds, clock, sample)
        rows = [_row(t, batch, context) for t in timed]
        _judge(timed, reference, settings, report, log)
        for row, t in zip(rows, timed):
            verdict = report.verdicts.get(t.config)
            row.update(verdict.to_dict() if verdict else {"agreement": None, "usable": None})
            log(f"{t.config.label:<28} batch {batch:>3}: p50 {row['p50_ms']:9.2f} ms  {row['img_per_s']:8.1f} img/s  "
                f"({row['provider']})")
        _speedups(rows)
        del timed  # free this batch size's sessions before the next opens
        report.rows.extend(rows)
        on_rows(rows)
    report.others_cpus = hardware.others_cpus(started, sample())
    if not report.rows:
        reasons = "; ".join(f"{s.config.label}: {s.reason}" for s in report.skipped)
        raise UserError(f"nothing could be measured ({reasons})")
    return report  # the caller says busy_warning(report) where its table goes


def _open_sessions(configs: list[Config], artifacts: Artifacts, settings: BenchSettings, batch: int,
                   report: BenchReport, log: Callable[[str], None]) -> list[_Timed]:
    """A session per configuration not skipped yet (one that cannot run here is skipped for every batch)."""
    timed = []
    inputs = random_inputs(batch, artifacts.source.spec.input_shape)  # latency does not depend on values
    skipped = {s.config for s in report.skipped}
    facts = hardware.device_facts(settings.target.device)
    for config in configs:
        if config in skipped:
            continue
        started = time.perf_counter()
        try:
            # Every row with the cuDNN autotuner and TF32 its precision gets everywhere (hardware.backends):
            # eager rows tuned as the engines they are compared with (its turns run under them too).
            with hardware.gpu_settings(facts, config.precision):
                session = get_runtime(config.backend).open(artifacts, config.precision, config.layout,
                                                           settings.target, batch)
            if config.tta != "none":
                session = AugmentedSession(session, config.tta)
        except Unsupported as exc:
            report.skipped.append(Skipped(config, str(exc)))
            log(f"skipped {config.label}: {exc}")
            continue
        setup_ms = (time.perf_counter() - started) * 1e3
        timed.append(_Timed(config, session, session.place(inputs), setup_ms,
                            settings=partial(hardware.gpu_settings, facts, config.precision)))
    return timed


def _row(t: _Timed, batch: int, context: dict[str, Any]) -> dict[str, Any]:
    row = {**asdict(t.config), "batch": batch, "provider": t.session.provider, **t.timing().stats(batch),
           **context, "loadavg_1min": load_average()}
    row["gflops"] = round(row["gflop_per_image"] * row["img_per_s"], 1) if row["gflop_per_image"] else None
    row["unsteady"] = row["spread"] is not None and row["spread"] > SPREAD_LIMIT
    row["machine_busy"] = row["others_cpus"] is not None and row["others_cpus"] > BUSY_CPUS
    return row


def _speedups(rows: list[dict[str, Any]]) -> None:
    """p50 latency of eager fp32 NCHW over each row's, at the same batch size (None without the reference)."""
    base = next((r["p50_ms"] for r in rows if Config(r["backend"], r["precision"], r["layout"]) == BASELINE), None)
    for row in rows:
        row["speedup"] = round(base / row["p50_ms"], 3) if base else None


def _judge(timed: list[_Timed], reference: _Reference, settings: BenchSettings, report: BenchReport,
           log: Callable[[str], None]) -> None:
    """Top-1 agreement with fp32 of each reduced precision, once (at its first batch size)."""
    for t in timed:
        if t.config.precision in REDUCED_PRECISIONS and t.config.tta == "none" and t.config not in report.verdicts:
            # At least MIN_HOLDOUT_IMAGES whatever --holdout says: fewer cannot tell 99% from 97%.
            verdict = judge(reference.logits(), t.session.predict(reference.inputs()), settings.min_agreement)
            report.verdicts[t.config] = verdict
            log(f"{t.config.label}: {verdict.reason} -> {'usable' if verdict.usable else 'NOT usable'}")


def busy_warning(report: BenchReport) -> str | None:
    """One line when other processes kept CPUs busy while rows were timed (None on a quiet machine)."""
    if not report.busy:
        return None
    worst = max((r["others_cpus"] or 0.0) for r in report.rows)
    return (f"the machine was not quiet: other processes used up to {worst:.2f} of {hardware.usable_cpus()} CPUs "
            f"while rows were timed (others_cpus, each row); the rows took turns in rounds, so their ratios stay "
            f"comparable, but latency and img/s are this load's, not the machine's: rerun on a quiet machine")


# --------------------------------------------------------------------------------------- results file


def result_records(report: BenchReport, source: ModelSource, settings: BenchSettings, command: str,
                   env: dict[str, Any]) -> Iterator[dict[str, Any]]:
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    for row in report.rows:
        yield {**row, "run_id": run_id, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "model": source.spec.arch,
               "source": source.label, "weights_sha256": source.weights_sha256,
               "input_shape": list(source.spec.input_shape), "command": command, "argv": sys.argv,
               "settings": settings.to_dict(), "env": env}


# --------------------------------------------------------------------------------------- table


def _fmt(value: Any, width: int, spec: str = "") -> str:
    """Right-aligned in `width` columns; "-" for a value that does not apply (None)."""
    return f"{'-' if value is None else format(value, spec):>{width}}"


def format_table(rows: list[dict[str, Any]]) -> str:
    """One comparison table, grouped by batch size, fastest first within a batch, with a key to its
    figures: img/s and speed-up come from the median (p50); `spread` is how far the rounds' medians
    differ ("!": over SPREAD_LIMIT, a figure not to trust); `others` is other processes' CPU use then."""
    tta = any(r.get("tta", "none") != "none" for r in rows)
    header = (f"{'backend':<12} {'precision':<9} {'layout':<13} " + (f"{'tta':<10} " if tta else "") +
              f"{'batch':>5} {'first ms':>9} {'mean ms':>9} "
              f"{'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} {'img/s p50':>9} {'GFLOP/s':>8} {'speed-up':>8} "
              f"{'spread':>7} {'others':>6} {'agree':>6} {'usable':>6}  provider")
    lines = [header, "-" * len(header)]
    for batch in sorted({r["batch"] for r in rows}):
        for r in sorted((r for r in rows if r["batch"] == batch), key=lambda r: r["p50_ms"]):
            agree = None if r.get("agreement") is None else f"{r['agreement']:.1%}"
            usable = None if r.get("usable") is None else ("yes" if r["usable"] else "NO")
            speedup = None if r.get("speedup") is None else f"{r['speedup']:.2f}x"
            spread = None if r.get("spread") is None else f"{r['spread']:.0%}" + ("!" if r.get("unsteady") else " ")
            others = None if r.get("others_cpus") is None else f"{r['others_cpus']:.2f}"
            lines.append(
                f"{r['backend']:<12} {r['precision']:<9} {r['layout']:<13} " +
                (f"{r.get('tta', 'none'):<10} " if tta else "") + f"{batch:>5} {r['first_ms']:>9.1f} "
                f"{r['mean_ms']:>9.2f} {r['p50_ms']:>9.2f} {r['p90_ms']:>9.2f} {r['p99_ms']:>9.2f} "
                f"{r['img_per_s']:>9.1f} {_fmt(r['gflops'], 8, '.1f')} {_fmt(speedup, 8)} {_fmt(spread, 7)} "
                f"{_fmt(others, 6)} {_fmt(agree, 6)} {_fmt(usable, 6)}  {r['provider']}")
    lines.append(f"img/s and speed-up from the median latency (p50); spread: how far the medians of the "
                 f"{max((r.get('rounds') or 1) for r in rows)} rounds differ, ! over {SPREAD_LIMIT:.0%} "
                 "(a figure that moved while measured); others: CPUs other processes used meanwhile")
    return "\n".join(lines)
