"""`make gpu-report` (benchmarks/gpu_report.py): its plan and budgets on the GPU image and elsewhere, its
dry run's checks, and that the report is on disk after every part: a failing, overrunning or killed part
never loses what finished before it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from inceptionlab.runtime import environment

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))  # a script beside its sibling _results, outside the package
import gpu_report  # noqa: E402

PARTS = ["doctor", "train", "sync-debug", "calibration", "gpu-tests", "bench", "bench-ort", "serve"]
# The GPU machine's image: an H100 with the CPU-only onnxruntime (tools/gpu_image.toml).
IMAGE = gpu_report.Machine(["Fake H100"], rocm=False, cpus=16, providers=["CPUExecutionProvider"])
NVIDIA_TRT = gpu_report.Machine(["Fake H100"], rocm=False, cpus=16, providers=[
    "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
AMD = gpu_report.Machine(["Fake MI300X"], rocm=True, cpus=16, providers=["MIGraphXExecutionProvider"])
CPU = gpu_report.Machine([], rocm=False, cpus=2, providers=["CPUExecutionProvider"])


def by_name(parts):
    return {part.name: part for part in parts}


def test_the_parts_run_most_valuable_first_within_8_minutes_on_the_gpu_image(tmp_path):
    (tmp_path / "tiny").mkdir()

    parts = by_name(gpu_report.plan(IMAGE, tmp_path / "tiny", tmp_path))

    assert list(parts) == PARTS == list(gpu_report.BUDGETS)
    assert sum(part.budget_s for part in parts.values()) <= 8 * 60 == gpu_report.TOTAL_BUDGET_S
    assert [name for name, part in parts.items() if part.skip] == ["bench-ort"]
    assert "no GPU provider" in parts["bench-ort"].skip
    train = parts["train"].command
    assert train[train.index("--batch") + 1] == "32" and train[train.index("--workers") + 1] == "8"
    assert train[train.index("--data") + 1] == str(tmp_path / "tiny") and "--json" in train
    # Sub-benchmarks write their result files into the report's work folder, not benchmarks/results.
    assert parts["train"].env == {gpu_report.RESULTS_ENV: str(tmp_path / "results")}
    assert parts["calibration"].command[parts["calibration"].command.index("--device") + 1] == "cuda"
    bench = parts["bench"].command
    assert bench[bench.index("--backend") + 1] == "eager,compile" and bench[bench.index("--device") + 1] == "cuda"
    assert parts["serve"].command[parts["serve"].command.index("--configs") + 1] == "1x1,1x32"


def test_named_gpu_tests_run_first_and_the_rest_by_marker_without_them(tmp_path):
    parts = by_name(gpu_report.plan(IMAGE, tmp_path, tmp_path))

    sync, rest = parts["sync-debug"].command, parts["gpu-tests"].command
    assert sync[sync.index("-k") + 1] == "sync_debug or waits_for_nothing" and " -m gpu -k " in " ".join(sync)
    assert rest[rest.index("-k") + 1] == "not (sync_debug or waits_for_nothing)" and " -m gpu -k " in " ".join(rest)
    assert f"--junitxml={tmp_path / 'sync-debug.xml'}" in sync
    files = [word for word in rest if word.endswith(".py")]
    assert files == gpu_report.gpu_test_files() and str(REPO / "tests" / "test_runtimes.py") in files
    assert parts["gpu-tests"].collect == [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-k",
                                          "not (sync_debug or waits_for_nothing)", "-p", "no:cacheprovider", *files]


def test_onnx_runtimes_gpu_provider_is_benched_where_installed(tmp_path):
    trt = by_name(gpu_report.plan(NVIDIA_TRT, tmp_path / "absent", tmp_path))
    amd = by_name(gpu_report.plan(AMD, tmp_path, tmp_path))

    for parts, provider in ((trt, "tensorrt"), (amd, "migraphx")):
        command = parts["bench-ort"].command
        assert parts["bench-ort"].skip is None and command[command.index("--provider") + 1] == provider
    assert trt["train"].skip.startswith(f"no tiny-imagenet at {tmp_path / 'absent'} (`make gpu-wheels` packs")


def test_without_a_gpu_the_gpu_parts_are_skipped_but_a_dry_run_checks_them(tmp_path):
    real = by_name(gpu_report.plan(CPU, tmp_path, tmp_path))
    dry = by_name(gpu_report.plan(CPU, tmp_path, tmp_path, dry_run=True))

    assert {name: part.skip for name, part in real.items() if name not in ("doctor", "bench-ort")} == {
        name: "no GPU visible to torch" for name in PARTS if name not in ("doctor", "bench-ort")}
    assert [name for name, part in dry.items() if part.skip] == ["bench-ort"]


def test_a_part_whose_optional_package_is_missing_is_skipped_naming_it(tmp_path, monkeypatch):
    real_find_spec = gpu_report.importlib.util.find_spec
    monkeypatch.setattr(gpu_report.importlib.util, "find_spec",
                        lambda name: None if name in ("fastapi", "uvicorn") else real_find_spec(name))

    parts = by_name(gpu_report.plan(IMAGE, tmp_path, tmp_path))

    assert parts["serve"].skip == "needs fastapi (serve extra), uvicorn (serve extra): not installed"
    assert parts["bench"].skip is None


def fake_script(tmp_path: Path) -> Path:
    script = tmp_path / "tool.py"
    script.write_text(textwrap.dedent("""\
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--data")
        parser.add_argument("--batch-size", type=int)
        parser.parse_args()
        """))
    return script


def test_the_dry_run_refuses_an_option_the_command_does_not_take(tmp_path):
    script = fake_script(tmp_path)
    good = gpu_report.Part("train", "t", [sys.executable, str(script), "--data", "x", "--batch-size=4"], None)
    bad = gpu_report.Part("train", "t", [sys.executable, str(script), "--data", "x", "--batch", "4", "--epochs", "2"],
                          None)

    assert gpu_report.check_part(good, tmp_path) == ("dry run: its 2 options are accepted", None)
    summary, error = gpu_report.check_part(bad, tmp_path)
    assert error.endswith("tool.py --help` does not list --batch, --epochs")  # --batch-size does not count


def test_the_dry_run_counts_the_tests_a_pytest_part_selects(tmp_path):
    tests = tmp_path / "test_fake_gpu.py"
    tests.write_text(textwrap.dedent("""\
        import pytest
        @pytest.mark.gpu
        def test_epochs_under_sync_debug_mode():
            pass
        def test_not_gpu():
            pass
        """))
    named = gpu_report.pytest_part("sync-debug", "t", ["-m", "gpu", "-k", "sync_debug"], tmp_path, [str(tests)])
    absent = gpu_report.pytest_part("sync-debug", "t", ["-m", "gpu", "-k", "resume"], tmp_path, [str(tests)])

    assert gpu_report.check_part(named, tmp_path) == ("dry run: selects 1 tests: test_epochs_under_sync_debug_mode",
                                                      None)
    assert gpu_report.check_part(absent, tmp_path) == ("dry run: selects no test in this checkout yet", None)


def python_part(name: str, code: str, budget: float = 60, parse=None) -> gpu_report.Part:
    def read_json(stdout, work):
        return {"summary": "read", **json.loads(stdout)}

    return gpu_report.Part(name, name, [sys.executable, "-c", code], parse or read_json, budget_s=budget,
                           needs_gpu=False)


def test_a_failing_and_an_overrunning_part_are_recorded_and_the_rest_still_run(tmp_path, monkeypatch):
    parts = [
        python_part("broken", "import sys; print('half a line', file=sys.stderr); sys.exit(3)", budget=1),
        python_part("slow", "import time; time.sleep(60)", budget=1),
        python_part("fine", "import json; print(json.dumps({'rows': [{'x': 1.5}], 'columns': [['x', 'x', '.1f']]}))",
                    budget=20),
    ]
    monkeypatch.setattr(gpu_report, "plan", lambda machine, data, work, dry_run: parts)
    started = time.monotonic()

    json_path, markdown = gpu_report.run_report(IMAGE, tmp_path, tmp_path, tmp_path / "work", say=lambda line: None,
                                                env=environment("cpu"), budget_s=22)  # this machine's: the GPU is fake

    assert time.monotonic() - started < 30  # the sleeping part was stopped at its budget (and what broken left)
    record = json.loads(json_path.read_text())
    rows = {row["part"]: row for row in record["rows"]}
    assert rows["broken"]["status"] == "failed"
    assert rows["broken"]["error"].startswith("exit code 3: half a line")
    assert rows["slow"]["status"] == "timed out" and re.search(r"budget of [12] s", rows["slow"]["error"])
    assert rows["fine"]["status"] == "ok" and rows["fine"]["summary"] == "read"
    assert record["finished"] and len(list(tmp_path.glob("gpu_report--*.json"))) == 1  # one file, rewritten
    text = markdown.read_text()
    assert "half a line" in text and "| 1.5 |" in text
    with tarfile.open(next(tmp_path.glob("gpu_report-logs--*.tar.gz"))) as archive:
        assert sorted(archive.getnames()) == ["gpu_report-logs/broken.log", "gpu_report-logs/fine.log",
                                              "gpu_report-logs/slow.log"]
        assert b"half a line" in archive.extractfile("gpu_report-logs/broken.log").read()


def test_the_report_is_on_disk_while_a_part_runs(tmp_path, monkeypatch):
    """The second part reads the report as it stands: the first part's figures are there, itself pending."""
    read_report = (f"import glob, json; path, = glob.glob({str(tmp_path / 'gpu_report--*.json')!r}); "
                   "record = json.load(open(path)); "
                   "print(json.dumps({'rows': [{'part': r['part'], 'status': r['status']} for r in record['rows']], "
                   "'columns': [['part', 'part'], ['status', 'status']]}))")
    parts = [python_part("first", "import json; print(json.dumps({'rows': [], 'columns': []}))"),
             python_part("second", read_report), python_part("third", "print('{}')")]
    monkeypatch.setattr(gpu_report, "plan", lambda machine, data, work, dry_run: parts)

    json_path, _ = gpu_report.run_report(IMAGE, tmp_path, tmp_path, tmp_path / "work", say=lambda line: None,
                                         env=environment("cpu"))

    seen = json.loads(json_path.read_text())["parts"]["second"]["rows"]
    assert seen == [{"part": "first", "status": "ok"}, {"part": "second", "status": "not reached"},
                    {"part": "third", "status": "not reached"}]


def test_a_report_killed_from_outside_keeps_the_parts_that_finished(tmp_path):
    """What the device tool does at its time limit: the whole process is killed, mid-part."""
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(f"""\
        import sys
        from pathlib import Path
        sys.path.insert(0, {str(REPO / 'benchmarks')!r})
        import gpu_report
        from inceptionlab.runtime import environment
        report = lambda stdout, work: {{"summary": stdout.strip(), "rows": [], "columns": []}}
        parts = [gpu_report.Part("measured", "m", [sys.executable, "-c", "print('42 img/s')"], report, budget_s=30,
                                 needs_gpu=False),
                 gpu_report.Part("killer", "k", [sys.executable, "-c",
                                 "import os, signal; os.kill(os.getppid(), signal.SIGKILL)"], report, budget_s=30,
                                 needs_gpu=False)]
        gpu_report.plan = lambda machine, data, work, dry_run: parts
        gpu_report.run_report(gpu_report.Machine(["Fake"], False, [], 1), Path({str(tmp_path)!r}),
                              Path({str(tmp_path / 'out')!r}), Path({str(tmp_path / 'work')!r}), env=environment("cpu"))
        """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}

    done = subprocess.run([sys.executable, str(driver)], env=env, capture_output=True, text=True, timeout=120)

    assert done.returncode == -signal.SIGKILL
    record = json.loads(next((tmp_path / "out").glob("gpu_report--*.json")).read_text())
    assert [(row["part"], row["status"], row["summary"]) for row in record["rows"]] == [
        ("measured", "ok", "42 img/s"), ("killer", "not reached", "not run yet")]
    assert not record["finished"] and "not reached yet" in record["note"]
    assert "42 img/s" in next((tmp_path / "out").glob("gpu_report--*.md")).read_text()
    assert not list((tmp_path / "out").glob("*.partial"))


def test_time_a_part_leaves_unused_goes_to_the_parts_after_it(tmp_path, monkeypatch):
    """On the H200 (2026-12-04) the report ended at 327 of its 480 s while gpu-tests and bench were stopped at
    their own 60 s: the time the earlier parts left is the later parts' (the skipped ones' too)."""
    parts = [python_part("quick", "print('{}')", budget=20),
             python_part("skipped", "print('{}')", budget=20),
             python_part("long", "import time; time.sleep(3); print('{}')", budget=1),
             python_part("last", "print('{}')", budget=5)]
    parts[1].skip = "not here"
    monkeypatch.setattr(gpu_report, "plan", lambda machine, data, work, dry_run: parts)

    json_path, _ = gpu_report.run_report(IMAGE, tmp_path, tmp_path, tmp_path / "work", say=lambda line: None,
                                         env=environment("cpu"), budget_s=46)

    rows = {row["part"]: row for row in json.loads(json_path.read_text())["rows"]}
    assert rows["long"]["status"] == "ok" and rows["last"]["status"] == "ok"


def test_a_part_past_the_deadline_is_skipped(tmp_path):
    outcome = gpu_report.run_part(python_part("late", "print(1)"), tmp_path, time.monotonic() - 1,
                                  say=lambda line: None)

    assert outcome.status == "skipped" and outcome.summary == "the report's time was spent"


def test_junit_counts_failing_tests_and_the_named_checks_are_read(tmp_path):
    (tmp_path / "gpu-tests.xml").write_text(
        '<testsuites><testsuite tests="5" failures="1" errors="0" skipped="1">'
        '<testcase classname="tests.test_doctor" name="test_gpu"/>'
        '<testcase classname="tests.test_checkpoint" name="test_resume_of_a_gpu_checkpoint"/>'
        '<testcase classname="tests.test_bench" name="test_cudnn_setting_in_every_row"><failure message="no"/>'
        '</testcase>'
        '<testcase classname="tests.test_runtimes" name="test_trt"><skipped message="no TensorRT"/></testcase>'
        '<testcase classname="tests.test_runtimes" name="test_cuda"/>'
        '</testsuite></testsuites>')

    figures = gpu_report.junit("gpu-tests")("", tmp_path)

    assert figures["summary"] == "3 passed, 1 failed, 1 skipped"
    assert figures["failed"] == ["tests.test_bench::test_cudnn_setting_in_every_row"]
    assert figures["skipped_reasons"] == ["no TensorRT"]
    verdicts = {row["keyword"]: row["verdict"] for row in figures["checks"]}
    assert verdicts == {"resume": "passed", "cudnn": "failed", "calibrat": "no test yet", "checkpoint": "passed"}


def test_a_bench_part_says_whether_every_row_ran_with_the_same_cudnn_settings(tmp_path):
    folder = tmp_path / "bench" / "inception_v3" / "bench"
    folder.mkdir(parents=True)
    line = {"backend": "eager", "precision": "fp32", "layout": "channels_last", "provider": "torch eager", "batch": 32,
            "img_per_s": 900.0}
    same = {"env": {"gpu_settings": {"cudnn_benchmark": True, "fp32_precision": "tf32"}}}
    (folder / "results.jsonl").write_text("\n".join(json.dumps({**line, **same}) for _ in range(2)) + "\n")
    stdout = json.dumps(line) + "\n" + json.dumps({**line, "backend": "compile", "img_per_s": 1500.0}) + "\n"

    figures = gpu_report.bench_parse("bench")(stdout, tmp_path)

    assert figures["summary"] == ("2 rows; fastest compile fp32 batch 32 (torch eager): 1500.0 img/s; "
                                  "cuDNN settings: the same in all 2 rows")
    other = {"env": {"gpu_settings": {"cudnn_benchmark": False, "fp32_precision": "tf32"}}}
    with open(folder / "results.jsonl", "a") as file:
        file.write(json.dumps({**line, **other}) + "\n")
    assert (gpu_report.cudnn_settings(tmp_path / "bench")["verdict"]
            == "cuDNN settings DIFFER between rows (2 kinds in 3 rows)")
    (folder / "results.jsonl").write_text(json.dumps(line) + "\n")
    assert gpu_report.cudnn_settings(tmp_path / "bench")["verdict"] == "cuDNN settings: not recorded in the rows"


def test_rows_printed_as_they_came_are_kept_when_the_result_file_never_came(tmp_path):
    stdout = '{"row": {"config": "guide", "images_per_s": 812.5, "vs_guide": 1.0}}\nsome progress line\n'

    figures = gpu_report.result_rows("train_end_to_end")(stdout, tmp_path)

    assert figures["rows"] == [{"config": "guide", "images_per_s": 812.5, "vs_guide": 1.0}]
    assert figures["summary"] == "1 rows before it stopped"
    with pytest.raises(ValueError, match="train_end_to_end wrote no result file"):
        gpu_report.result_rows("train_end_to_end")("no rows\n", tmp_path)


@pytest.mark.parametrize("stdout", ["", "not json\n"])
def test_bench_output_without_rows_is_an_error(stdout, tmp_path):
    with pytest.raises(ValueError, match="bench printed no rows"):
        gpu_report.bench_parse("bench")(stdout, tmp_path)


def test_calibration_output_gives_the_decision_its_time_and_the_memory_held(tmp_path):
    stdout = json.dumps({"seconds": 74.2, "gpu_memory_after": {"allocated_mib": 90, "reserved_mib": 2048},
                         "decision": {"label": "bf16 channels_last", "candidates": ["fp32 nchw", "bf16 channels_last",
                                                                                    "bf16 channels_last compile"],
                                      "img_per_s": {"fp32 nchw": 700.0, "bf16 channels_last": 1900.0},
                                      "ruled_out": {"bf16 channels_last compile": "failed: out of memory"}}})

    figures = gpu_report.parse_calibration("progress\n" + stdout + "\n", tmp_path)

    assert figures["summary"] == ("bf16 channels_last in 74 s end to end (candidates: fp32 nchw, bf16 channels_last, "
                                  "bf16 channels_last compile); GPU memory held after it: 2048 MiB reserved")
    assert [row["chosen"] for row in figures["rows"]] == [False, True, False]
    assert figures["rows"][2]["why_not"] == "failed: out of memory"


@pytest.mark.slow  # a doctor and four Python start-ups checking commands: ~1-2 minutes on 2 shared cores
def test_dry_run_plans_every_part_runs_the_doctor_checks_the_rest_and_writes_both_files(tmp_path, capsys):
    assert gpu_report.main(["--dry-run", "--out", str(tmp_path), "--data", str(REPO / "tools")]) == 0

    (json_path,) = tmp_path.glob("gpu_report--*.json")
    record = json.loads(json_path.read_text())
    rows = {row["part"]: row for row in record["rows"]}
    assert list(rows) == PARTS and record["finished"]
    assert rows["doctor"]["status"] in ("ok", "failed", "timed out")  # the only part that runs: this machine's
    planned = {part: row["summary"] for part, row in rows.items() if part not in ("doctor", "bench-ort")}
    assert {row["status"] for part, row in rows.items() if part in planned} == {"planned"}
    assert all(summary.startswith("dry run: ") for summary in planned.values())
    printed = capsys.readouterr().out
    assert all(f"[{part}] " in printed for part in PARTS)  # every command printed
    markdown = json_path.with_suffix(".md").read_text()
    assert markdown.startswith("# GPU report") and "| doctor |" in markdown
    assert markdown == gpu_report.render_report(record)  # the Markdown is drawn from the JSON alone


def gpu_marked_tests(source: str) -> list[str]:
    """Names of the test functions a module marks `gpu` (decorated, or the whole module by pytestmark)."""
    import ast

    tree = ast.parse(source)
    whole = any(isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)
                and "mark.gpu" in ast.unparse(node.value) for node in tree.body)
    return [node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
            and (whole or any("mark.gpu" in ast.unparse(d) for d in node.decorator_list))]


def test_every_gpu_test_that_runs_under_sync_debug_mode_is_in_the_reports_sync_debug_part():
    """The report runs its sync-debug part early and names it: a test that runs the data path under
    torch.cuda.set_sync_debug_mode but whose name lacks the part's keyword would run later, unnamed
    (test_gpu_sync.py's did, found by the report's dry run)."""
    import ast

    keywords = [word.strip() for word in gpu_report.NAMED_TESTS["sync-debug"][0].split(" or ")]
    checked = []
    for module in sorted((REPO / "tests").glob("test_*.py")):
        source = module.read_text()
        calls = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
                 and getattr(node.func, "attr", "") == "set_sync_debug_mode"]
        if not calls:
            continue
        for name in gpu_marked_tests(source):
            checked.append(name)
            assert any(word in name for word in keywords), f"{module.name}::{name} lacks {' or '.join(keywords)}"
    assert len(checked) >= 2  # the data path's and the device augmentation's tests were found
