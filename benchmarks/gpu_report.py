"""The GPU figures in one command, in about 8 minutes: `make gpu-report` (python benchmarks/gpu_report.py).

On a GPU machine it runs these parts, most valuable first, each within its own time budget (PARTS; they
add up to TOTAL_BUDGET_S):

1. `doctor`: `inceptionlab doctor --expect-gpu --json` (versions, GPUs, arch, device access, providers);
2. `train`: Inception v3 training img/s at 299 px on the tiny-imagenet files, the guide's loop (fp32,
   batch 32, DataLoader workers) against `auto` with the resident data path (train_end_to_end.py);
3. `sync-debug`: the GPU-marked tests named `sync_debug` (and the augmentation step's): training and
   evaluation epochs on the resident and stream paths under `torch.cuda.set_sync_debug_mode("error")`
   (NAMED_TESTS);
4. `calibration`: the speed calibration a long run makes (compile decided by the probe), timed end to
   end: its decision, time and the GPU memory it leaves held (calibration_time.py);
5. `gpu-tests`: the other GPU-marked tests (`pytest -m gpu`), with a line per named check (CHECKS:
   resume of a GPU checkpoint, one cuDNN setting everywhere, ...);
6. `bench`: `inceptionlab bench` of eager and torch.compile, fp32 and fp16, and whether every row ran
   with the same cuDNN settings;
7. `bench-ort`: ONNX Runtime with its GPU provider (TensorRT, CUDA or MIGraphX), where installed;
8. `serve`: a short serve sweep (serve.py), HTTP, batching off and on.

Each part is a subprocess in its own process group; one that fails or runs out of time is recorded
with its error and the last lines of its output, and the others go on. A part whose optional package
is missing (`Part.needs`) is skipped, saying which. The report is written after every part, so a run
stopped from outside still leaves what finished:

    $OUT/gpu_report--<machine>--<time>.json  and  .md      (OUT unset: benchmarks/results/)
    $OUT/gpu_report-logs--<time>.tar.gz                    each part's log and result files

Without a GPU visible to torch, only the doctor runs. `--dry-run` plans every part as a GPU machine
would, runs the doctor, checks every other part's command without running it (its options against
its `--help`; a pytest part's selection by collecting it) and exits non-zero if one would be refused;
a CPU machine can test all of it. On a GPU machine without network, `tools/gpu_offline.py report`
installs the package from carried wheels and runs this (docs/testing.md).

    python benchmarks/gpu_report.py [--data DIR] [--out DIR] [--work DIR] [--budget-s S] [--dry-run]
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from _results import RESULTS_ENV, cell, machine_line, software_line, table, write_result

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
DEFAULT_DATA = REPO.parent / "shared" / "data" / "tiny-imagenet-200"
CARRIED_DATA = REPO / ".gpu-data" / "tiny-imagenet-200"  # packed by `make gpu-wheels` (tools/gpu_offline.py)
TOTAL_BUDGET_S = 480  # 8 minutes: a device machine's 15 minutes less its start, the install and a margin
TAIL_CHARS = 2000  # of a failed part's output, kept in the report
LOG_BYTES = 256 * 1024  # of each log, kept in the logs archive (the device tool returns 16 MiB a file)
CHECK_TIMEOUT_S = 240  # one dry-run check (a --help, a test collection: 10 s idle, 2 minutes on 2 busy cores)
DRY_RUN_WORKERS = 4  # checks at a time: each is a Python start-up, mostly waiting on imports

# Time budgets in seconds, in the order the parts run: the most valuable figures first. The sum is
# TOTAL_BUDGET_S; a part that finishes early (or is skipped) leaves its time to the next ones (run_part).
BUDGETS = {
    "doctor": 30,  # 14 s on the H200 (2026-12-04); ~10 s on an idle machine
    "train": 150,  # 109 s on the H200, before auto's calibration timed its four candidates (~30 s more)
    "sync-debug": 30,  # 19 s on the H200
    "calibration": 70,  # 47 s on the H200 timing nothing; four kernel searches of 5-6 s each and the set-up
    "gpu-tests": 70,  # 46 s of tests and ~15 s of start-up on the H200, stopped at 60
    "bench": 60,  # Inception v3's compile at two precisions alone takes more: it gets what the others leave
    "bench-ort": 30,
    "serve": 40,
}
# GPU-marked tests that get a part of their own (they run before the rest), by pytest keyword:
# part name -> (keyword expression, title). A test is picked by its name, its module's or a marker.
# `waits_for_nothing`: the device augmentation policy's step under sync debug mode (test_device_policy.py).
NAMED_TESTS = {
    "sync-debug": ("sync_debug or waits_for_nothing", "training and evaluation epochs on the resident and stream "
                   "paths, and the device augmentation step, under torch.cuda.set_sync_debug_mode('error')"),
}
# Checks read out of the GPU-marked tests' results, one line each: keyword -> what it shows.
CHECKS = {
    "resume": "resume of a GPU checkpoint",
    "cudnn": "one cuDNN/TF32 setting for training, bench, evaluate and serve",
    "calibrat": "the calibration: budget, failures cached, memory released",
    "checkpoint": "checkpoints save the run's own device RNG",
}
SETTING_KEYS = re.compile(r"cudnn|tf32|fp32_precision|allow_fp16|matmul", re.I)  # cuDNN/TF32 settings in a row


@dataclass
class Part:
    """One measurement: a command, its time budget, and how its output becomes figures."""

    name: str
    title: str
    command: list[str]
    parse: Callable[[str, Path], dict[str, Any]]
    budget_s: float = 0.0  # 0: BUDGETS[name]
    needs_gpu: bool = True
    cheap: bool = False  # runs in a dry run too
    skip: str | None = None  # why it cannot run here, decided when planning
    env: dict[str, str] = field(default_factory=dict)
    needs: dict[str, str] = field(default_factory=dict)  # module -> the extra that installs it
    collect: list[str] | None = None  # pytest parts: the command that lists the tests it selects

    def __post_init__(self) -> None:
        self.budget_s = self.budget_s or BUDGETS[self.name]


@dataclass
class Outcome:
    part: str
    title: str
    status: str  # ok | failed | timed out | skipped | planned | not reached
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
    verdict = "healthy" if report["ok"] else f"unhealthy (failing: {', '.join(failing)})"
    summary = "; ".join([verdict, f"GPUs: {', '.join(gpus) or 'none'}"]
                        + ([f"warnings: {', '.join(warned)}"] if warned else []))
    return {"summary": summary, "report": report}


def junit(part: str) -> Callable[[str, Path], dict[str, Any]]:
    """Counts, failing tests and the CHECKS lines of the part's JUnit XML."""
    def parse(stdout: str, work: Path) -> dict[str, Any]:
        suite = ET.parse(work / f"{part}.xml").getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
        cases = [_case(case) for case in suite.iter("testcase")]
        failed = [case["id"] for case in cases if case["outcome"] == "failed"]
        passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
        summary = f"{passed} passed, {counts['failures'] + counts['errors']} failed, {counts['skipped']} skipped"
        if not counts["tests"]:
            summary = "no test selected"
        return {"summary": summary, "counts": counts, "failed": failed, "checks": check_lines(cases),
                "skipped_reasons": sorted({case["reason"] for case in cases if case["outcome"] == "skipped"})}
    return parse


def _case(case: ET.Element) -> dict[str, str]:
    outcome = "passed"
    reason = ""
    for tag, name in (("failure", "failed"), ("error", "failed"), ("skipped", "skipped")):
        found = case.find(tag)
        if found is not None:
            outcome, reason = name, (found.get("message") or "")[:300]
            break
    return {"id": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome, "reason": reason}


def check_lines(cases: list[dict[str, str]]) -> list[dict[str, Any]]:
    """One row per CHECKS keyword: how many of the tests named so passed, failed or were skipped."""
    rows = []
    for keyword, what in CHECKS.items():
        named = [case for case in cases if keyword in case["id"].lower()]
        counts = {outcome: sum(case["outcome"] == outcome for case in named)
                  for outcome in ("passed", "failed", "skipped")}
        rows.append({"check": what, "keyword": keyword, **counts,
                     "verdict": "no test yet" if not named else "failed" if counts["failed"]
                     else "passed" if counts["passed"] else "skipped"})
    return rows


def result_rows(benchmark: str) -> Callable[[str, Path], dict[str, Any]]:
    """The rows of the result file `benchmark` wrote into the part's results folder; failing that, the
    rows it printed as JSON lines as it went (a part stopped at its budget keeps what it measured)."""
    def parse(stdout: str, work: Path) -> dict[str, Any]:
        files = sorted((work / "results").glob(f"{benchmark}--*.json"))
        if files:
            record = json.loads(files[-1].read_text())
            return {"summary": f"{len(record['rows'])} rows: {record['title']}", "rows": record["rows"],
                    "columns": record["columns"], "title": record["title"]}
        rows = [json.loads(line)["row"] for line in stdout.splitlines() if line.startswith('{"row":')]
        if not rows:
            raise ValueError(f"{benchmark} wrote no result file")
        return {"summary": f"{len(rows)} rows before it stopped", "rows": rows,
                "columns": [[key, key] for key in rows[0] if not isinstance(rows[0][key], (dict, list))]}
    return parse


def parse_calibration(stdout: str, work: Path) -> dict[str, Any]:
    result = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
    decision = result["decision"]
    held = result.get("gpu_memory_after") or {}
    memory = f"; GPU memory held after it: {held['reserved_mib']} MiB reserved" if held else ""
    summary = (f"{decision['label']} in {result['seconds']:.0f} s end to end (candidates: "
               f"{', '.join(decision['candidates']) or decision['label']}){memory}")
    rows = [{"candidate": label, "img_per_s": decision["img_per_s"].get(label),
             "chosen": label == decision["label"], "why_not": decision["ruled_out"].get(label)}
            for label in decision["candidates"] or [decision["label"]]]
    return {"summary": summary, "result": result, "rows": rows,
            "columns": [["candidate", "candidate"], ["img_per_s", "img/s", ".1f"], ["chosen", "chosen"],
                        ["why_not", "why not"]]}


def bench_parse(work_exports: str) -> Callable[[str, Path], dict[str, Any]]:
    def parse(stdout: str, work: Path) -> dict[str, Any]:
        rows = [{key: row.get(key) for key in BENCH_KEYS} for row in map(json.loads, _json_lines(stdout))]
        if not rows:
            raise ValueError("bench printed no rows")
        best = max(rows, key=lambda row: row["img_per_s"] or 0)
        settings = cudnn_settings(work / work_exports)
        return {"summary": f"{len(rows)} rows; fastest {best['backend']} {best['precision']} batch {best['batch']} "
                           f"({best['provider']}): {best['img_per_s']:.1f} img/s; {settings['verdict']}",
                "rows": rows, "columns": BENCH_COLUMNS, "cudnn_settings": settings}
    return parse


def _json_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("{")]


def cudnn_settings(folder: Path) -> dict[str, Any]:
    """The cuDNN/TF32 settings each row of bench's results file ran with, and whether all were the same."""
    rows = [json.loads(line) for path in sorted(folder.rglob("results.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]
    seen = [json.dumps(_settings_in(row), sort_keys=True) for row in rows]
    distinct = sorted(set(seen))
    if not rows or distinct == ["{}"]:
        verdict = "cuDNN settings: not recorded in the rows"
    elif len(distinct) == 1:
        verdict = f"cuDNN settings: the same in all {len(rows)} rows"
    else:
        verdict = f"cuDNN settings DIFFER between rows ({len(distinct)} kinds in {len(rows)} rows)"
    return {"verdict": verdict, "distinct": [json.loads(text) for text in distinct]}


def _settings_in(value: Any, path: str = "") -> dict[str, Any]:
    found: dict[str, Any] = {}
    if isinstance(value, dict):
        for key, item in value.items():
            inner = f"{path}.{key}" if path else str(key)
            if SETTING_KEYS.search(str(key)) and not isinstance(item, (dict, list)):
                found[inner] = item
            else:
                found.update(_settings_in(item, inner))
    return found


BENCH_KEYS = ("backend", "precision", "layout", "provider", "batch", "img_per_s", "p50_ms", "p99_ms", "speedup",
              "agreement", "usable")
BENCH_COLUMNS = [["backend", "backend"], ["provider", "provider"], ["precision", "precision"], ["layout", "layout"],
                 ["batch", "batch"], ["img_per_s", "img/s", ".1f"], ["p50_ms", "p50 ms", ".2f"],
                 ["p99_ms", "p99 ms", ".2f"], ["speedup", "vs eager fp32", ".2f"],
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
        """ONNX Runtime's best provider for this GPU, if the installed package has one."""
        wanted = ([("MIGraphXExecutionProvider", "migraphx")] if self.rocm else
                  [("TensorrtExecutionProvider", "tensorrt"), ("CUDAExecutionProvider", "cuda")])
        return next((short for name, short in wanted if name in self.providers), None)


def gpu_test_files(tests: Path = REPO / "tests") -> list[str]:
    """The test files whose code marks a test `gpu` (`@pytest.mark.gpu`, `pytestmark = pytest.mark.gpu`, a
    list holding it): collecting only these takes seconds, the whole suite a minute or more (every module's
    imports). Read with `ast`, so a test file that only writes such a line into a string is not one."""
    def marks_gpu(path: Path) -> bool:
        return any(isinstance(node, ast.Attribute) and node.attr == "gpu" and isinstance(node.value, ast.Attribute)
                   and node.value.attr == "mark" for node in ast.walk(ast.parse(path.read_text())))

    return [str(path) for path in sorted(tests.glob("test_*.py")) if marks_gpu(path)]


def pytest_part(name: str, title: str, selection: list[str], work: Path, files: list[str] | None = None) -> Part:
    py = sys.executable
    base = [py, "-m", "pytest", *selection, "-p", "no:cacheprovider", *(gpu_test_files() if files is None else files)]
    return Part(name, title, [*base[:3], "-q", "-rs", f"--junitxml={work / f'{name}.xml'}", *base[3:]], junit(name),
                collect=[*base[:3], "--collect-only", "-q", *base[3:]])


def plan(machine: Machine, data: Path, work: Path, dry_run: bool = False) -> list[Part]:
    """Every part, in BUDGETS' order, with its command. A dry run plans the GPU parts as a GPU machine
    would (to check them); a real run without a GPU skips them."""
    py = sys.executable
    results = {RESULTS_ENV: str(work / "results")}  # sub-benchmarks write here, not into benchmarks/results
    workers = min(8, machine.cpus)  # the loaders' own default: one per core, at most 8
    ort = machine.ort_gpu_provider
    named = " or ".join(keyword for keyword, _ in NAMED_TESTS.values())
    serve_plans = _serve_configs(machine.cpus)
    parts = [
        Part("doctor", "inceptionlab doctor", [py, "-m", "inceptionlab", "doctor", "--json",
                                               *(["--expect-gpu"] if machine.gpu else [])],
             parse_doctor, needs_gpu=False, cheap=True),
        Part("train", "Inception v3 training, 299 px, batch 32: the guide's loop against auto",
             [py, str(BENCHMARKS / "train_end_to_end.py"), "--data", str(data), "--samples", "2048", "--batch", "32",
              "--epochs", "2", "--workers", str(workers), "--json"], result_rows("train_end_to_end"), env=results,
             skip=None if data.is_dir() else f"no tiny-imagenet at {data} (`make gpu-wheels` packs a subset into "
                                             ".gpu-data; or --data)"),
        *[pytest_part(name, title, ["-m", "gpu", "-k", keyword], work)
          for name, (keyword, title) in NAMED_TESTS.items()],
        Part("calibration", "the calibration of a long Inception v3 run (compile by the probe), end to end",
             [py, str(BENCHMARKS / "calibration_time.py"), "--device", "cuda",
              "--recipe", "inception_v3/tiny_imagenet"],
             parse_calibration),
        pytest_part("gpu-tests", "the other GPU-marked tests",
                    ["-m", "gpu", *(["-k", f"not ({named})"] if named else [])], work),
        Part("bench", "inceptionlab bench: eager and torch.compile, fp32 and fp16, batch 32",
             [py, "-m", "inceptionlab", "bench", "--model", "inception_v3", "--weights", "random", "--device", "cuda",
              "--backend", "eager,compile", "--precision", "fp32,fp16", "--layout", "channels_last", "--batch", "32",
              "--iters", "30", "--warmup", "5", "--out", str(work / "bench"), "--no-plot", "--json"],
             bench_parse("bench")),
        Part("bench-ort", f"inceptionlab bench: ONNX Runtime's {ort or 'GPU'} provider, fp16",
             [py, "-m", "inceptionlab", "bench", "--model", "inception_v3", "--weights", "random", "--device", "cuda",
              "--backend", "onnxruntime", "--provider", ort or "cuda", "--precision", "fp16", "--batch", "1,32",
              "--iters", "30", "--warmup", "5", "--out", str(work / "bench-ort"), "--no-plot", "--json"],
             bench_parse("bench-ort"), needs={"onnx": "onnx-export", "onnxscript": "onnx-export"},
             skip=None if ort else "ONNX Runtime has no GPU provider here (the CPU-only onnxruntime is installed: "
                                   "onnxruntime-gpu for CUDA/TensorRT, onnxruntime-migraphx for ROCm)"),
        Part("serve", f"serve sweep: eager fp16 over HTTP, {' and '.join(serve_plans)}",
             [py, str(BENCHMARKS / "serve.py"), "--models", "inception_v3", "--peer", "none",
              "--backend", "eager", "--precision", "fp16", "--configs",
              ",".join(serve_plans), "--protocols", "http", "--duration", "2", "--max-steps", "3",
              "--min-requests", "20", "--bench-iters", "10", "--out", str(work / "serve")], result_rows("serve"),
             env=results,
             needs={"fastapi": "serve", "uvicorn": "serve", "multipart": "serve", "grpc_health": "serve",
                    "aiohttp": "loadtest"}),
    ]
    for part in parts:
        if part.needs_gpu and not machine.gpu and not dry_run and not part.skip:
            part.skip = "no GPU visible to torch"
        missing = [f"{module} ({extra} extra)" for module, extra in part.needs.items()
                   if importlib.util.find_spec(module) is None]
        if missing and not part.skip:
            part.skip = f"needs {', '.join(missing)}: not installed"
    return parts


def _serve_configs(cpus: int) -> list[str]:
    """serve.py's names of one instance unbatched and batched (hardware.serve_plans)."""
    from inceptionlab import hardware

    return [plan.label for plan in hardware.serve_plans(cpus, gpu=False, instances=1, max_batch=None)]


# --------------------------------------------------------------------------- running a part


def run_part(part: Part, work: Path, deadline: float, dry_run: bool = False,
             say: Callable[[str], None] = print, reserve: float = 0.0) -> Outcome:
    """Run one part within what is left before `deadline` less `reserve` (the budgets of the parts still to
    run), and at least its own budget while the deadline allows: time the earlier parts did not use is
    this one's. Never raises."""
    outcome = Outcome(part.name, part.title, "planned", part.budget_s, shown(part.command))
    say(f"[{part.name}] {outcome.command}")
    if part.skip:
        outcome.status, outcome.summary = "skipped", part.skip
        say(f"[{part.name}] skipped: {part.skip}")
        return outcome
    if dry_run and not part.cheap:
        outcome.summary, outcome.error = check_part(part, work)
        if outcome.error:
            outcome.status = "failed"
        say(f"[{part.name}] {outcome.status}: {outcome.error or outcome.summary}")
        return outcome
    left = deadline - time.monotonic()
    budget = min(left, max(part.budget_s, left - reserve))
    if budget <= 0:
        outcome.status, outcome.summary = "skipped", "the report's time was spent"
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
        outcome.status = "failed"  # e.g. an unhealthy doctor or a failing test: its figures are kept
        outcome.error = outcome.error or f"exit code {code}"
    say(f"[{part.name}] {outcome.status} in {outcome.seconds:.0f} s: {outcome.error or outcome.summary}")
    return outcome


def shown(command: list[str]) -> str:
    """The command as the report shows it: `python` for this interpreter, paths inside the checkout relative."""
    words = ["python" if word == sys.executable else word.replace(f"{REPO}/", "") for word in command]
    return shlex.join(words)


def _run(command: list[str], env: dict[str, str], timeout: float, log: Path) -> tuple[int | None, str, str | None]:
    """(exit code or None on timeout, stdout, error with the output's tail). Its own process group, so a
    timeout also stops what it started (DataLoader workers, a server). stdout is kept in the log too."""
    with open(log, "w") as stderr_file:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr_file, text=True,
                                   start_new_session=True)
        try:
            stdout, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, _ = process.communicate()
            code, error = None, _tail(log, stdout)
        else:
            code = process.returncode
            error = None if code == 0 else f"exit code {code}: {_tail(log, stdout)}"
    with open(log, "a") as file:
        file.write(f"\n--- stdout ---\n{stdout}")
    return code, stdout, error


def _tail(log: Path, stdout: str) -> str:
    text = (log.read_text(errors="replace") + stdout).strip()
    return text[-TAIL_CHARS:] if text else "no output"


# --------------------------------------------------------------------------- the dry run's checks


def check_part(part: Part, work: Path) -> tuple[str, str | None]:
    """(summary, error): would the GPU machine accept this part's command? Options against its --help,
    a pytest selection by collecting it. Nothing is measured."""
    if part.collect:
        return _check_collection(part)
    help_command = _help_command(part.command)
    done = _check_run(help_command)
    if isinstance(done, str):
        return "", done
    text = re.sub(r"\s+", " ", done.stdout + done.stderr)
    options = sorted({token.split("=")[0] for token in part.command if token.startswith("--")})
    unknown = [option for option in options if not re.search(re.escape(option) + r"(?![\w-])", text)]
    if done.returncode != 0 or unknown:
        return "", (f"`{' '.join(help_command)}` " + (f"does not list {', '.join(unknown)}" if unknown
                                                       else f"failed: {_last(done)}"))
    return f"dry run: its {len(options)} options are accepted", None


def _check_collection(part: Part) -> tuple[str, str | None]:
    done = _check_run(part.collect)
    if isinstance(done, str):
        return "", done
    selected = [line for line in done.stdout.splitlines() if "::" in line]
    if done.returncode == 5 or (done.returncode == 0 and not selected):  # 5: pytest selected no test
        return "dry run: selects no test in this checkout yet", None
    if done.returncode != 0:
        return "", f"collecting its tests failed: {_last(done)}"
    shown = ", ".join(line.split("::", 1)[1] for line in selected[:6]) + (" ..." if len(selected) > 6 else "")
    return f"dry run: selects {len(selected)} tests: {shown}", None


def _check_run(command: list[str]) -> subprocess.CompletedProcess | str:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"}  # rich wraps to the terminal
    try:
        return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"`{' '.join(command)}` did not finish in {CHECK_TIMEOUT_S} s"


def _help_command(command: list[str]) -> list[str]:
    """The command's program and subcommands, then --help: `python -m inceptionlab bench --help`."""
    start = 3 if command[1:2] == ["-m"] else 2
    end = start
    while end < len(command) and not command[end].startswith("-"):
        end += 1
    return [*command[:end], "--help"]


def _last(done: subprocess.CompletedProcess) -> str:
    return (done.stderr or done.stdout).strip()[-TAIL_CHARS:] or f"exit code {done.returncode}"


# --------------------------------------------------------------------------- the report


@dataclass
class Report:
    """The report's files, rewritten after every part: what finished is on disk whatever stops the run."""

    machine: Machine
    data: Path
    out: Path
    work: Path
    dry_run: bool
    budget_s: float
    env: dict[str, Any] | None = None
    install: dict[str, Any] | None = None
    stamp: str = field(default_factory=lambda: time.strftime("%Y%m%d-%H%M%S"))
    json_path: Path | None = None

    def write(self, outcomes: list[Outcome], pending: list[Part]) -> tuple[Path, Path]:
        waiting = [Outcome(p.name, p.title, "not reached", p.budget_s, shown(p.command), summary="not run yet")
                   for p in pending]
        rows = [{key: value for key, value in asdict(o).items() if key != "figures"} for o in [*outcomes, *waiting]]
        skipped = [f"{o.part}: {o.summary}" for o in outcomes if o.status == "skipped"]
        details = {"gpu": self.machine.gpu, "gpus": self.machine.gpus, "rocm": self.machine.rocm,
                   "providers": self.machine.providers, "note": self.note(outcomes, pending), "skipped": skipped,
                   "parts": {o.part: o.figures for o in outcomes}, "finished": not pending}
        if self.install:
            details["install"] = {key: self.install[key] for key in ("steps", "seconds") if key in self.install}
            details["image_packages"] = self.install.get("image_packages", {})
        path = write_result(
            "gpu_report", rows, folder=self.out, device="cuda:0" if self.machine.gpu else "cpu", env=self.env,
            title=f"GPU report: {details['note']}", stamp=self.stamp,
            columns=[("part", "part"), ("status", "status"), ("seconds", "seconds", ".0f"),
                     ("budget_s", "budget s", ".0f"), ("summary", "result")],
            settings={"data": str(self.data), "dry_run": self.dry_run, "total_budget_s": self.budget_s},
            details=details, quiet=True)
        if self.env is None:  # the environment record once: the next writes reuse it
            self.env = json.loads(path.read_text())["env"]
        markdown = path.with_suffix(".md")
        _atomic_text(markdown, render_report(json.loads(path.read_text())))
        self.json_path = path
        self.archive_logs()
        return path, markdown

    def note(self, outcomes: list[Outcome], pending: list[Part]) -> str:
        if not self.machine.gpu:
            note = ("No GPU visible to torch: the doctor ran, the other parts were checked as a GPU machine would "
                    "run them." if self.dry_run else
                    "No GPU visible to torch: the doctor ran, the GPU parts were skipped.")
        else:
            note = f"GPUs: {', '.join(self.machine.gpus)}."
        if self.dry_run:
            note = "Dry run: every part planned and checked, only the doctor run. " + note
        if pending:
            note += f" In progress: {len(pending)} parts not reached yet."
        return note

    def archive_logs(self) -> None:
        """Each part's log (its last LOG_BYTES) and the result files of the sub-benchmarks, in one archive."""
        target = self.out / f"gpu_report-logs--{self.stamp}.tar.gz"
        partial = target.with_name(target.name + ".partial")
        with tarfile.open(partial, "w:gz") as archive:
            for path in sorted([*self.work.glob("*.log"), *self.work.glob("*.xml"), *self.work.glob("install.json"),
                                *(self.work / "results").glob("*.json")]):
                data = path.read_bytes()[-LOG_BYTES:]
                info = tarfile.TarInfo(f"gpu_report-logs/{path.relative_to(self.work)}")
                info.size, info.mtime = len(data), int(path.stat().st_mtime)
                archive.addfile(info, _BytesReader(data))
        os.replace(partial, target)


class _BytesReader:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def read(self, size: int = -1) -> bytes:
        end = len(self.data) if size < 0 else self.at + size
        chunk, self.at = self.data[self.at:end], min(end, len(self.data))
        return chunk


def _atomic_text(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def run_report(machine: Machine, data: Path, out: Path, work: Path, dry_run: bool = False,
               say: Callable[[str], None] = print, env: dict[str, Any] | None = None,
               budget_s: float = TOTAL_BUDGET_S, install: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """Run (or plan) every part, rewriting the JSON and Markdown report in `out` after each; returns both
    paths. `env`: the environment record (default: the project's, of the first GPU or the CPU)."""
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + budget_s
    parts = plan(machine, data, work, dry_run)
    report = Report(machine, data, out, work, dry_run, budget_s, env, install)
    outcomes: list[Outcome] = []
    paths = report.write(outcomes, parts)
    # A dry run measures nothing: its checks (and the doctor) run side by side. A real run's parts share
    # the GPU, so they run one after another.
    with ThreadPoolExecutor(max_workers=DRY_RUN_WORKERS if dry_run else 1) as pool:
        reserves = [sum(later.budget_s for later in parts[index + 1:] if not later.skip) for index in range(len(parts))]
        running = [pool.submit(run_part, part, work, deadline, dry_run, say, reserve)
                   for part, reserve in zip(parts, reserves)]
        for index, future in enumerate(running):
            outcomes.append(future.result())
            paths = report.write(outcomes, parts[index + 1:])
    say(f"report: {paths[1]}")
    return paths


def render_report(record: dict[str, Any]) -> str:
    """The Markdown report, from the JSON record alone."""
    lines = ["# GPU report", "", f"**{machine_line(record['env'])}**", "", software_line(record["env"]), "",
             record["note"], ""]
    if record["skipped"]:
        lines += ["Skipped:", "", *[f"- {item}" for item in record["skipped"]], ""]
    lines += [*table(record["columns"], record["rows"]), ""]
    if record.get("install"):
        steps = record["install"]["steps"]
        lines += [f"Installed from the carried wheels in {record['install']['seconds']:.0f} s: "
                  + ", ".join(f"{s['name']} {'ok' if s['ok'] else 'FAILED'}" for s in steps), ""]
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
    lines = []
    if "rows" in figures:
        lines += [*table(figures["columns"], figures["rows"]), ""]
    if "cudnn_settings" in figures:
        lines += [figures["cudnn_settings"]["verdict"], ""]
    if "counts" in figures:
        failed = [f"- {name}" for name in figures["failed"]]
        lines += [", ".join(f"{key} {cell(value)}" for key, value in figures["counts"].items()), "", *failed,
                  *([""] if failed else [])]
        lines += [*table([["check", "check"], ["verdict", "verdict"], ["passed", "passed"], ["failed", "failed"],
                          ["skipped", "skipped"]], figures["checks"]), ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None, help="tiny-imagenet-200 in its original layout "
                        "(default: .gpu-data's, else ../shared/data's)")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default: $OUT, else "
                        "benchmarks/results; with --dry-run and no $OUT a new temporary folder)")
    parser.add_argument("--work", type=Path, default=None, help="logs, exports and sub-results (default: a new "
                                                                "temporary folder)")
    parser.add_argument("--budget-s", type=float, default=TOTAL_BUDGET_S,
                        help=f"seconds for all parts (default {TOTAL_BUDGET_S}; less if given less)")
    parser.add_argument("--install-record", type=Path, default=None, help="the offline install's record "
                        "(tools/gpu_offline.py), shown in the report")
    parser.add_argument("--dry-run", action="store_true", help="plan and check every part, run only the doctor")
    args = parser.parse_args(argv)
    from _results import results_folder

    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else
                       Path(tempfile.mkdtemp(prefix="gpu-report-")) if args.dry_run else results_folder())
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-report-work-"))
    data = args.data or (CARRIED_DATA if CARRIED_DATA.is_dir() else DEFAULT_DATA)
    install = json.loads(args.install_record.read_text()) if args.install_record else None
    machine = Machine.probe()
    print(f"# GPU report: {', '.join(machine.gpus) or 'no GPU visible to torch'}; ONNX Runtime providers: "
          f"{', '.join(machine.providers) or 'none'}; {min(args.budget_s, TOTAL_BUDGET_S):.0f} s; work in {work}",
          flush=True)
    json_path, _ = run_report(machine, data, out, work, args.dry_run, say=lambda line: print(line, flush=True),
                              budget_s=min(args.budget_s, TOTAL_BUDGET_S), install=install)
    refused = [row["part"] for row in json.loads(json_path.read_text())["rows"]
               if row["status"] == "failed" and row["part"] != "doctor"]
    # A dry run is green when the GPU machine would accept every command (the doctor's verdict is this
    # machine's); a real run reports whatever it found.
    if args.dry_run and refused:
        print(f"dry run: these parts would be refused: {', '.join(refused)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
