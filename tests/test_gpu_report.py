"""`make gpu-report` (benchmarks/gpu_report.py): its CPU dry run, its plan on a fake GPU machine, and that a
failing or overrunning part is recorded without stopping the others."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from inceptionlab.runtime import environment

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))  # a script beside its sibling _results, outside the package
import gpu_report  # noqa: E402

PARTS = ["doctor", "train-check", "gpu-tests", "train", "ceiling", "bench", "bench-tensorrt", "serve"]
NVIDIA = gpu_report.Machine(["Fake H100"], rocm=False, cpus=16,
                            providers=["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
AMD = gpu_report.Machine(["Fake MI300X"], rocm=True, cpus=16, providers=["CPUExecutionProvider"])


def test_dry_run_plans_every_part_runs_the_doctor_and_writes_both_files(tmp_path, capsys):
    assert gpu_report.main(["--dry-run", "--out", str(tmp_path), "--data", str(tmp_path / "no-data")]) == 0

    (json_path,) = tmp_path.glob("gpu_report--*.json")
    record = json.loads(json_path.read_text())
    rows = {row["part"]: row for row in record["rows"]}
    assert list(rows) == PARTS
    assert all(row["command"] for row in rows.values())
    assert rows["doctor"]["status"] in ("ok", "failed")  # it ran: failed on a host whose GPU is not seen
    assert record["parts"]["doctor"]["report"]["checks"]  # ... and its report was read either way
    printed = capsys.readouterr().out
    assert all(f"[{part}] " in printed for part in PARTS)  # every command printed
    machine = gpu_report.Machine.probe()
    if not machine.gpu:
        assert record["note"].startswith("Dry run") and "No GPU visible to torch" in record["note"]
        assert {row["status"] for part, row in rows.items() if part != "doctor"} == {"skipped"}
        assert len(record["skipped"]) == len(PARTS) - 1
    markdown = json_path.with_suffix(".md").read_text()
    assert markdown.startswith("# GPU report") and "| doctor |" in markdown and "| ok | python |" in markdown
    assert markdown == gpu_report.render_report(record)  # the Markdown is drawn from the JSON alone


def test_on_an_nvidia_machine_the_plan_uses_cuda_and_tensorrt_within_25_minutes(tmp_path):
    (tmp_path / "tiny").mkdir()

    parts = {part.name: part for part in gpu_report.plan(NVIDIA, tmp_path / "tiny", tmp_path)}

    assert list(parts) == PARTS and not [part.name for part in parts.values() if part.skip]
    assert sum(part.budget_s for part in parts.values()) <= 25 * 60
    assert "--expect-gpu" in parts["doctor"].command
    assert parts["bench"].command[parts["bench"].command.index("--provider") + 1] == "cuda"
    assert "tensorrt" in parts["bench-tensorrt"].command
    train = parts["train"].command
    assert train[train.index("--batch") + 1] == "32" and train[train.index("--workers") + 1] == "8"
    assert parts["ceiling"].command[parts["ceiling"].command.index("--device") + 1] == "cuda"
    assert "onnxruntime" in parts["serve"].command
    # Sub-benchmarks write their result files into the report's work folder, not benchmarks/results.
    assert parts["train"].env == {gpu_report.RESULTS_ENV: str(tmp_path / "results")}


def test_on_amd_without_migraphx_the_plan_benches_eager_and_skips_tensorrt(tmp_path):
    parts = {part.name: part for part in gpu_report.plan(AMD, tmp_path / "absent", tmp_path)}

    assert "--provider" not in parts["bench"].command and "eager" in parts["bench"].command
    assert "no TensorRT provider" in parts["bench-tensorrt"].skip
    assert parts["train"].skip.startswith(f"no tiny-imagenet at {tmp_path / 'absent'}")
    assert "onnxruntime" not in parts["serve"].command


def test_a_dry_run_on_a_gpu_machine_plans_the_gpu_parts_without_running_them(tmp_path):
    part = gpu_report.plan(NVIDIA, tmp_path, tmp_path)[2]

    outcome = gpu_report.run_part(part, tmp_path, time.monotonic() + 60, dry_run=True, say=lambda line: None)

    assert (outcome.status, outcome.summary) == ("planned", "dry run: planned, not run")
    assert not (tmp_path / "gpu-tests.xml").exists()


def python_part(name: str, code: str, budget: float = 60, parse=None) -> gpu_report.Part:
    def read_json(stdout, work):
        return {"summary": "read", **json.loads(stdout)}

    return gpu_report.Part(name, name, budget, [sys.executable, "-c", code], parse or read_json, needs_gpu=False)


def test_a_failing_and_an_overrunning_part_are_recorded_and_the_rest_still_run(tmp_path, monkeypatch):
    parts = [
        python_part("broken", "import sys; print('half a line', file=sys.stderr); sys.exit(3)"),
        python_part("slow", "import time; time.sleep(60)", budget=1),
        python_part("fine", "import json; print(json.dumps({'rows': [{'x': 1.5}], 'columns': [['x', 'x', '.1f']]}))"),
    ]
    monkeypatch.setattr(gpu_report, "plan", lambda machine, data, work: parts)
    started = time.monotonic()

    json_path, markdown = gpu_report.run_report(NVIDIA, tmp_path, tmp_path, tmp_path / "work", say=lambda line: None,
                                                env=environment("cpu"))  # this machine's: the GPU is fake

    assert time.monotonic() - started < 30  # the sleeping part was stopped at its budget
    rows = {row["part"]: row for row in json.loads(json_path.read_text())["rows"]}
    assert rows["broken"]["status"] == "failed"
    assert rows["broken"]["error"].startswith("exit code 3: half a line")
    assert rows["slow"]["status"] == "timed out" and "budget of 1 s" in rows["slow"]["error"]
    assert rows["fine"]["status"] == "ok" and rows["fine"]["summary"] == "read"
    text = markdown.read_text()
    assert "half a line" in text and "| 1.5 |" in text


def test_the_25_minutes_are_shared_a_part_past_the_deadline_is_skipped(tmp_path):
    outcome = gpu_report.run_part(python_part("late", "print(1)"), tmp_path, time.monotonic() - 1,
                                  say=lambda line: None)

    assert outcome.status == "skipped" and "25 minutes" in outcome.summary


def test_junit_counts_and_failing_tests_are_read(tmp_path):
    (tmp_path / "gpu-tests.xml").write_text(
        '<testsuites><testsuite tests="4" failures="1" errors="0" skipped="1">'
        '<testcase classname="tests.test_doctor" name="test_gpu"/>'
        '<testcase classname="tests.test_bench" name="test_fp16"><failure message="no"/></testcase>'
        '<testcase classname="tests.test_runtimes" name="test_trt"><skipped/></testcase>'
        '<testcase classname="tests.test_runtimes" name="test_cuda"/>'
        '</testsuite></testsuites>')

    figures = gpu_report.parse_junit("", tmp_path)

    assert figures["summary"] == "2 passed, 1 failed, 1 skipped"
    assert figures["failed"] == ["tests.test_bench::test_fp16"]


@pytest.mark.parametrize("stdout", ["", "not json\n"])
def test_bench_output_without_rows_is_an_error(stdout, tmp_path):
    with pytest.raises(ValueError, match="bench printed no rows"):
        gpu_report.parse_bench(stdout, tmp_path)
