"""Inference benchmark: warm-up, synchronised timing, first call apart, percentiles, environment.

For every configuration (backend x precision x layout) and batch size:

1. open a session (`setup_ms`: load, optimise, compile an engine; quantization is done before,
   once, and cached);
2. time the first call alone (`first_ms`: torch.compile compiles here, oneDNN creates kernels);
3. `warmup` untimed calls, then `iters` timed calls, each ending with the device synchronised,
   with Python's garbage collector paused (as `timeit` does);
4. report mean/p50/p90/p99 latency, images/s and the GFLOP/s that achieves.

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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

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
            "p90_ms", "p99_ms", "img_per_s", "gflop_per_image", "gflops", "speedup", "agreement", "usable")


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


@dataclass
class Timing:
    setup_ms: float
    first_ms: float
    times_ms: list[float]

    def stats(self, batch: int) -> dict[str, float]:
        times = np.asarray(self.times_ms)
        mean = float(times.mean())
        return {
            "setup_ms": round(self.setup_ms, 2),
            "first_ms": round(self.first_ms, 3),
            "mean_ms": round(mean, 3),
            "std_ms": round(float(times.std()), 3),
            "min_ms": round(float(times.min()), 3),
            "p50_ms": round(float(np.percentile(times, 50)), 3),
            "p90_ms": round(float(np.percentile(times, 90)), 3),
            "p99_ms": round(float(np.percentile(times, 99)), 3),
            "img_per_s": round(batch * 1000.0 / mean, 3),
        }


def time_session(session: RuntimeSession, inputs: np.ndarray, iters: int, warmup: int, setup_ms: float) -> Timing:
    placed = session.place(inputs)
    start = time.perf_counter()
    session.run(placed)
    first_ms = (time.perf_counter() - start) * 1e3
    for _ in range(warmup):
        session.run(placed)
    times = []
    gc.collect()
    gc_was_on = gc.isenabled()
    gc.disable()  # a collection inside a timed call would be charged to the runtime
    try:
        for _ in range(iters):
            start = time.perf_counter()
            session.run(placed)
            times.append((time.perf_counter() - start) * 1e3)
    finally:
        if gc_was_on:
            gc.enable()
    return Timing(setup_ms, first_ms, times)


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
              on_rows: Callable[[list[dict[str, Any]]], None] = lambda rows: None) -> BenchReport:
    """Measure every configuration at every batch size; `on_rows` gets each configuration's rows."""
    report = BenchReport()
    if any(c.precision in REDUCED_PRECISIONS for c in configs):
        held = image_files(settings.holdout_images, source) if settings.holdout_images else None
        report.sets = image_sets(image_files(settings.calib_images or None, source), source.spec,
                                 settings.calibration, settings.holdout, held)
        log(f"agreement images: {report.sets.describe()}")
    artifacts = Artifacts(source, settings.calib_images or None, report.sets, settings.onnx, log)
    reference = _Reference(source, report.sets)
    context = {"gflop_per_image": gflop_per_image(source.model, source.spec.input_shape)}
    baseline: dict[int, float] = {}
    facts = hardware.device_facts(settings.target.device)
    for config in configs:
        try:
            # Every row with the cuDNN autotuner and TF32 its precision gets everywhere (hardware.backends):
            # eager rows tuned as the engines they are compared with.
            with hardware.gpu_settings(facts, config.precision):
                rows, verdict = _measure_config(config, artifacts, settings, reference, context, log)
        except Unsupported as exc:
            report.skipped.append(Skipped(config, str(exc)))
            log(f"skipped {config.label}: {exc}")
            continue
        for row in rows:
            if config == BASELINE:
                baseline[row["batch"]] = row["p50_ms"]
            base = baseline.get(row["batch"])
            row["speedup"] = round(base / row["p50_ms"], 3) if base else None
        if verdict is not None:
            report.verdicts[config] = verdict
        report.rows.extend(rows)
        on_rows(rows)
    if not report.rows:
        reasons = "; ".join(f"{s.config.label}: {s.reason}" for s in report.skipped)
        raise UserError(f"nothing could be measured ({reasons})")
    return report


def _measure_config(config: Config, artifacts: Artifacts, settings: BenchSettings, reference: _Reference,
                    context: dict[str, Any], log: Callable[[str], None]) -> tuple[list[dict[str, Any]], Verdict | None]:
    runtime = get_runtime(config.backend)
    rows = []
    session: RuntimeSession | None = None
    for batch in settings.batches:
        session = None  # free the previous batch size's session before building the next
        started = time.perf_counter()
        session = runtime.open(artifacts, config.precision, config.layout, settings.target, batch)
        if config.tta != "none":
            session = AugmentedSession(session, config.tta)
        setup_ms = (time.perf_counter() - started) * 1e3
        inputs = random_inputs(batch, artifacts.source.spec.input_shape)  # latency does not depend on values
        timing = time_session(session, inputs, settings.iters, settings.warmup, setup_ms)
        row = {**asdict(config), "batch": batch, "provider": session.provider, **timing.stats(batch),
               **context, "loadavg_1min": load_average()}
        row["gflops"] = round(row["gflop_per_image"] * row["img_per_s"], 1) if row["gflop_per_image"] else None
        rows.append(row)
        log(f"{config.label:<28} batch {batch:>3}: p50 {row['p50_ms']:9.2f} ms  {row['img_per_s']:8.1f} img/s  "
            f"({session.provider})")
    verdict = None
    if config.precision in REDUCED_PRECISIONS and session is not None and config.tta == "none":
        # At least MIN_HOLDOUT_IMAGES whatever --holdout says: fewer cannot tell 99% from 97%.
        verdict = judge(reference.logits(), session.predict(reference.inputs()), settings.min_agreement)
        log(f"{config.label}: {verdict.reason} -> {'usable' if verdict.usable else 'NOT usable'}")
    for row in rows:
        row.update(verdict.to_dict() if verdict else {"agreement": None, "usable": None})
    return rows, verdict


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
    """One comparison table, grouped by batch size, fastest first within a batch."""
    tta = any(r.get("tta", "none") != "none" for r in rows)
    header = (f"{'backend':<12} {'precision':<9} {'layout':<13} " + (f"{'tta':<10} " if tta else "") +
              f"{'batch':>5} {'first ms':>9} {'mean ms':>9} "
              f"{'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} {'img/s':>8} {'GFLOP/s':>8} {'speed-up':>8} "
              f"{'agree':>6} {'usable':>6}  provider")
    lines = [header, "-" * len(header)]
    for batch in sorted({r["batch"] for r in rows}):
        for r in sorted((r for r in rows if r["batch"] == batch), key=lambda r: r["p50_ms"]):
            agree = None if r.get("agreement") is None else f"{r['agreement']:.1%}"
            usable = None if r.get("usable") is None else ("yes" if r["usable"] else "NO")
            speedup = None if r.get("speedup") is None else f"{r['speedup']:.2f}x"
            lines.append(
                f"{r['backend']:<12} {r['precision']:<9} {r['layout']:<13} " +
                (f"{r.get('tta', 'none'):<10} " if tta else "") + f"{batch:>5} {r['first_ms']:>9.1f} "
                f"{r['mean_ms']:>9.2f} {r['p50_ms']:>9.2f} {r['p90_ms']:>9.2f} {r['p99_ms']:>9.2f} "
                f"{r['img_per_s']:>8.1f} {_fmt(r['gflops'], 8, '.1f')} {_fmt(speedup, 8)} {_fmt(agree, 6)} "
                f"{_fmt(usable, 6)}  {r['provider']}")
    return "\n".join(lines)
