"""The GPU figures in one command: `make gpu-report` (python benchmarks/gpu_report.py).

On a GPU machine, in one go and within 25 minutes (TOTAL_BUDGET_S), it runs:

1. `inceptionlab doctor --expect-gpu --json`: versions, GPUs, arch, device access, /dev/shm, providers;
2. `inceptionlab doctor --train-check`: a small CNN trained on every device;
3. the GPU-marked tests (`pytest -m gpu`);
4. training img/s of Inception v3 at 299 px on the tiny-imagenet files: the guide's loop (fp32, batch 32,
   DataLoader workers) against `auto` with the resident data path (benchmarks/train_end_to_end.py);
5. the synthetic-data ceiling of the same step, batch 32, on the GPU (benchmarks/train_throughput.py);
6. `inceptionlab bench` of eager and ONNX Runtime with its GPU provider (CUDA or MIGraphX), fp32 and
   fp16, batch 1 and 32, and with TensorRT where ONNX Runtime has it;
7. a short serve sweep (benchmarks/serve.py): batching off and on, the same runtime.

Each part is a subprocess in its own process group with its own time budget (PARTS); one that fails
or runs out of time is recorded with its error and the last lines of its output, and the others go
on. The report is one JSON file written by `_results.write_result` (a row per part, the environment
record, each part's figures under "parts") and one Markdown file rendered from it, beside it:

    benchmarks/results/gpu_report--<machine>--<time>.json  and  .md

Without a GPU visible to torch, only the doctor runs, and the report says so and which parts it
skipped. `--dry-run` plans every part, prints its command, runs only the cheap ones (the doctor) and
writes the report into --out (default: a new temporary folder), so a CPU machine can test all of it.

    python benchmarks/gpu_report.py [--data ../shared/data/tiny-imagenet-200] [--out DIR] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from _results import RESULTS_ENV, cell, machine_line, software_line, table, write_result

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
DEFAULT_DATA = REPO.parent / "shared" / "data" / "tiny-imagenet-200"
TOTAL_BUDGET_S = 25 * 60
TAIL_CHARS = 2000  # of a failed part's output, kept in the report


@dataclass
class Part:
    """One measurement: a command, its time budget, and how its output becomes figures."""

    name: str
    title: str
    budget_s: float
    command: list[str]
    parse: Callable[[str, Path], dict[str, Any]]
    needs_gpu: bool = True
    cheap: bool = False  # runs in a dry run too
    skip: str | None = None  # why it cannot run here, decided when planning
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Outcome:
    part: str
    title: str
    status: str  # ok | failed | timed out | skipped | planned
    budget_s: float
    command: str
    seconds: float = 0.0
    summary: str = ""
    error: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- what each part's output says


def parse_doctor(stdout: str, work: Path) -> dict[str, Any]:
    report = json.loads(stdout)
    failing = [c["name"] for c in report["checks"] if c["status"] == "fail"]
    warned = [c["name"] for c in report["checks"] if c["status"] == "warn"]
    gpus = [d.get("name", d["device"]) for d in report["devices"] if d["type"] != "cpu"]
    trained = [f"{c['name']}: {c['detail']}" for c in report["checks"] if c["name"].startswith("train")]
    verdict = "healthy" if report["ok"] else f"unhealthy (failing: {', '.join(failing)})"
    summary = "; ".join([verdict, f"GPUs: {', '.join(gpus) or 'none'}"]
                        + ([f"warnings: {', '.join(warned)}"] if warned else []) + trained)
    return {"summary": summary, "report": report}


def parse_junit(stdout: str, work: Path) -> dict[str, Any]:
    suite = ET.parse(work / "gpu-tests.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    failed = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
              if case.find("failure") is not None or case.find("error") is not None]
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    summary = f"{passed} passed, {counts['failures'] + counts['errors']} failed, {counts['skipped']} skipped"
    return {"summary": summary, "counts": counts, "failed": failed}


def result_rows(benchmark: str) -> Callable[[str, Path], dict[str, Any]]:
    """The rows of the result file `benchmark` wrote into the part's results folder."""
    def parse(stdout: str, work: Path) -> dict[str, Any]:
        files = sorted((work / "results").glob(f"{benchmark}--*.json"))
        if not files:
            raise ValueError(f"{benchmark} wrote no result file")
        record = json.loads(files[-1].read_text())
        return {"summary": f"{len(record['rows'])} rows: {record['title']}", "rows": record["rows"],
                "columns": record["columns"], "title": record["title"]}
    return parse


def parse_bench(stdout: str, work: Path) -> dict[str, Any]:
    rows = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            rows.append({key: row.get(key) for key in BENCH_KEYS})
    if not rows:
        raise ValueError("bench printed no rows")
    best = max(rows, key=lambda row: row["img_per_s"] or 0)
    return {"summary": f"{len(rows)} rows; fastest {best['backend']} {best['precision']} batch {best['batch']} "
                       f"({best['provider']}): {best['img_per_s']:.1f} img/s", "rows": rows,
            "columns": BENCH_COLUMNS}


BENCH_KEYS = ("backend", "precision", "layout", "provider", "batch", "img_per_s", "p50_ms", "p99_ms", "agreement",
              "usable")
BENCH_COLUMNS = [["backend", "backend"], ["provider", "provider"], ["precision", "precision"], ["batch", "batch"],
                 ["img_per_s", "img/s", ".1f"], ["p50_ms", "p50 ms", ".2f"], ["p99_ms", "p99 ms", ".2f"],
                 ["agreement", "top-1 agreement", ".3f"], ["usable", "usable"]]


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Machine:
    """What planning needs to know: GPUs torch sees, its build, and ONNX Runtime's providers."""

    gpus: list[str]
    rocm: bool
    providers: list[str]
    cpus: int

    @classmethod
    def probe(cls) -> Machine:
        import torch

        from inceptionlab.infer.runtimes import ort_installed_providers

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return cls([torch.cuda.get_device_name(i) for i in range(count)], bool(getattr(torch.version, "hip", None)),
                   ort_installed_providers(), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                   else os.cpu_count() or 1)

    @property
    def gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def ort_gpu_provider(self) -> str | None:
        """ONNX Runtime's provider for this GPU, if the installed package has it."""
        wanted = ("MIGraphXExecutionProvider", "migraphx") if self.rocm else ("CUDAExecutionProvider", "cuda")
        return wanted[1] if wanted[0] in self.providers else None


def plan(machine: Machine, data: Path, work: Path) -> list[Part]:
    """Every part, in order, with its budget (they add up to TOTAL_BUDGET_S) and command."""
    py = sys.executable
    results = {RESULTS_ENV: str(work / "results")}  # sub-benchmarks write here, not into benchmarks/results
    workers = min(8, machine.cpus)  # the loaders' own default: one per core, at most 8
    ort = machine.ort_gpu_provider
    gpu_missing = "no GPU visible to torch"
    ort_backends = ["eager,onnxruntime", "--provider", ort] if ort else ["eager"]
    serve_backend = "onnxruntime" if ort else "eager"
    parts = [
        Part("doctor", "inceptionlab doctor", 60, [py, "-m", "inceptionlab", "doctor", "--json",
                                                    *(["--expect-gpu"] if machine.gpu else [])],
             parse_doctor, needs_gpu=False, cheap=True),
        Part("train-check", "doctor --train-check", 120,
             [py, "-m", "inceptionlab", "doctor", "--train-check", "--expect-gpu", "--json"], parse_doctor),
        Part("gpu-tests", "the GPU-marked tests", 240,
             [py, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={work / 'gpu-tests.xml'}",
              str(REPO / "tests")], parse_junit),
        Part("train", "Inception v3 training, 299 px, batch 32: the guide's loop against auto", 360,
             [py, str(BENCHMARKS / "train_end_to_end.py"), "--data", str(data), "--samples", "2048", "--batch", "32",
              "--epochs", "2", "--workers", str(workers)], result_rows("train_end_to_end"), env=results,
             skip=None if data.is_dir() else f"no tiny-imagenet at {data} (`inceptionlab data tiny-imagenet`, or --data)"),
        Part("ceiling", "the same step on synthetic data (no loader): the ceiling", 180,
             [py, str(BENCHMARKS / "train_throughput.py"), "--device", "cuda", "--batch", "32", "--size", "299",
              "--configs", "plain,fp32,auto", "--steps", "20", "--warmup", "5"], result_rows("train_throughput"),
             env=results),
        Part("bench", f"inceptionlab bench: eager and ONNX Runtime ({ort or 'no GPU provider installed'})", 240,
             [py, "-m", "inceptionlab", "bench", "--model", "inception_v3", "--weights", "random", "--device", "cuda",
              "--backend", *ort_backends, "--precision", "fp32,fp16", "--batch", "1,32", "--iters", "50",
              "--warmup", "10", "--out", str(work / "exports"), "--no-plot", "--json"], parse_bench),
        Part("bench-tensorrt", "inceptionlab bench: ONNX Runtime's TensorRT provider", 120,
             [py, "-m", "inceptionlab", "bench", "--model", "inception_v3", "--weights", "random", "--device", "cuda",
              "--backend", "onnxruntime", "--provider", "tensorrt", "--precision", "fp16", "--batch", "1,32",
              "--iters", "50", "--warmup", "10", "--out", str(work / "exports"), "--no-plot", "--json"], parse_bench,
             skip=None if "TensorrtExecutionProvider" in machine.providers
             else "ONNX Runtime has no TensorRT provider here (onnxruntime-gpu with TensorRT installed)"),
        Part("serve", f"serve sweep: {serve_backend} fp16, batching off and on", 180,
             [py, str(BENCHMARKS / "serve.py"), "--backend", serve_backend, "--precision", "fp16",
              "--configs", "unbatched,batch8_delay2", "--duration", "3", "--max-steps", "4", "--bench-iters", "10",
              "--out", str(work / "serve")], result_rows("serve"), env=results),
    ]
    for part in parts:
        if part.needs_gpu and not machine.gpu:
            part.skip = gpu_missing
    return parts


# --------------------------------------------------------------------------- running a part


def run_part(part: Part, work: Path, deadline: float, dry_run: bool = False,
             say: Callable[[str], None] = print) -> Outcome:
    """Run one part within min(its budget, what is left before `deadline`); never raises."""
    outcome = Outcome(part.name, part.title, "planned", part.budget_s, " ".join(part.command))
    say(f"[{part.name}] {outcome.command}")
    if part.skip:
        outcome.status, outcome.summary = "skipped", part.skip
        say(f"[{part.name}] skipped: {part.skip}")
        return outcome
    if dry_run and not part.cheap:
        outcome.summary = "dry run: planned, not run"
        return outcome
    budget = min(part.budget_s, deadline - time.monotonic())
    if budget <= 0:
        outcome.status, outcome.summary = "skipped", "the report's 25 minutes were spent"
        return outcome
    log = work / f"{part.name}.log"
    started = time.monotonic()
    code, stdout, error = _run(part.command, {**os.environ, **part.env}, budget, log)
    outcome.seconds = round(time.monotonic() - started, 1)
    if code is None:
        outcome.status, outcome.error = "timed out", f"stopped after its budget of {budget:.0f} s; {error}"
    elif error is not None:
        outcome.status, outcome.error = "failed", error
    try:
        figures = part.parse(stdout, work)
    except Exception as exc:  # a part that failed often leaves nothing to parse: its error says why
        if outcome.error is None:
            outcome.status, outcome.error = "failed", f"its output could not be read: {type(exc).__name__}: {exc}"
    else:
        outcome.summary = figures.pop("summary")
        outcome.figures = figures
        if outcome.status == "planned":
            outcome.status = "ok"
    if code not in (None, 0) and outcome.status == "ok":
        outcome.status = "failed"  # e.g. an unhealthy doctor: its report is kept, its exit code counts
        outcome.error = outcome.error or f"exit code {code}"
    say(f"[{part.name}] {outcome.status} in {outcome.seconds:.0f} s: {outcome.error or outcome.summary}")
    return outcome


def _run(command: list[str], env: dict[str, str], timeout: float, log: Path) -> tuple[int | None, str, str | None]:
    """(exit code or None on timeout, stdout, error with the output's tail). Its own process group, so a
    timeout also stops what it started (DataLoader workers, a server)."""
    with open(log, "w") as stderr_file:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr_file, text=True,
                                   start_new_session=True)
        try:
            stdout, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, _ = process.communicate()
            return None, stdout, _tail(log, stdout)
    if process.returncode != 0:
        return process.returncode, stdout, f"exit code {process.returncode}: {_tail(log, stdout)}"
    return 0, stdout, None


def _tail(log: Path, stdout: str) -> str:
    text = (log.read_text(errors="replace") + stdout).strip()
    return text[-TAIL_CHARS:] if text else "no output"


# --------------------------------------------------------------------------- the report


def run_report(machine: Machine, data: Path, out: Path, work: Path, dry_run: bool = False,
               say: Callable[[str], None] = print, env: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """Run (or plan) every part and write the JSON and Markdown report into `out`; returns both paths.
    `env`: the environment record (default: the project's, of the first GPU or the CPU)."""
    work.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + TOTAL_BUDGET_S
    outcomes = [run_part(part, work, deadline, dry_run, say) for part in plan(machine, data, work)]
    skipped = [f"{o.part}: {o.summary}" for o in outcomes if o.status == "skipped"]
    if not machine.gpu:
        note = f"No GPU visible to torch: the doctor ran, the GPU parts were skipped ({len(skipped)})."
    else:
        note = f"GPUs: {', '.join(machine.gpus)}."
    if dry_run:
        note = "Dry run: every part planned, only the doctor run. " + note
    rows = [{key: value for key, value in asdict(o).items() if key != "figures"} for o in outcomes]
    path = write_result(
        "gpu_report", rows, folder=out, device="cuda:0" if machine.gpu else "cpu", env=env,
        title=f"GPU report: {note}",
        columns=[("part", "part"), ("status", "status"), ("seconds", "seconds", ".0f"),
                 ("budget_s", "budget s", ".0f"), ("summary", "result")],
        settings={"data": str(data), "dry_run": dry_run, "total_budget_s": TOTAL_BUDGET_S},
        details={"gpu": machine.gpu, "gpus": machine.gpus, "rocm": machine.rocm, "providers": machine.providers,
                 "note": note, "skipped": skipped, "parts": {o.part: o.figures for o in outcomes}})
    markdown = path.with_suffix(".md")
    markdown.write_text(render_report(json.loads(path.read_text())))
    say(f"report: {markdown}")
    return path, markdown


def render_report(record: dict[str, Any]) -> str:
    """The Markdown report, from the JSON record alone."""
    lines = ["# GPU report", "", f"**{machine_line(record['env'])}**", "", software_line(record["env"]), "",
             record["note"], ""]
    if record["skipped"]:
        lines += ["Skipped:", "", *[f"- {item}" for item in record["skipped"]], ""]
    lines += [*table(record["columns"], record["rows"]), ""]
    for row in record["rows"]:
        figures = record["parts"].get(row["part"]) or {}
        section = [f"## {row['part']}: {row['title']}", "", f"Status: {row['status']}"
                   + (f" in {row['seconds']:.0f} s" if row["seconds"] else "") + f" (budget {row['budget_s']:.0f} s)",
                   "", f"`{row['command']}`", ""]
        if row["error"]:
            section += ["```", row["error"], "```", ""]
        section += _figures(figures)
        lines += section
    return "\n".join(lines).rstrip() + "\n"


def _figures(figures: dict[str, Any]) -> list[str]:
    if "report" in figures:  # a doctor run: its checks
        checks = figures["report"]["checks"]
        return [*table([["status", "status"], ["name", "check"], ["detail", "detail"]],
                       [{**c, "detail": c["detail"].replace("\n", " ")} for c in checks]), ""]
    if "rows" in figures:
        return [*table(figures["columns"], figures["rows"]), ""]
    if "counts" in figures:
        failed = [f"- {name}" for name in figures["failed"]]
        return [", ".join(f"{key} {cell(value)}" for key, value in figures["counts"].items()), "", *failed,
                *([""] if failed else [])]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="tiny-imagenet-200 (original layout)")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default: benchmarks/results; "
                                                               "with --dry-run a new temporary folder)")
    parser.add_argument("--work", type=Path, default=None, help="logs, exports and sub-results (default: "
                                                                "runs/gpu-report/<time>, or inside --out with --dry-run)")
    parser.add_argument("--dry-run", action="store_true", help="plan every part, print the commands, run only "
                                                               "the doctor, write the report")
    args = parser.parse_args(argv)
    from _results import results_folder

    out = args.out or (Path(tempfile.mkdtemp(prefix="gpu-report-")) if args.dry_run else results_folder())
    stamp = time.strftime("%Y%m%d-%H%M%S")
    work = args.work or (out / "work" if args.dry_run else REPO / "runs" / "gpu-report" / stamp)
    machine = Machine.probe()
    print(f"# GPU report: {', '.join(machine.gpus) or 'no GPU visible to torch'}; "
          f"ONNX Runtime providers: {', '.join(machine.providers) or 'none'}", flush=True)
    run_report(machine, args.data, out, work, args.dry_run, say=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
