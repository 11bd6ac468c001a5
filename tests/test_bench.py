"""`inceptionlab bench`: the --json schema, the comparison table, results.jsonl rows, plots, bad options."""

from __future__ import annotations

import json
from importlib.metadata import version

import pytest
import torch
from conftest import make_image_folder

pytest.importorskip("onnxruntime")

SCHEMA = {  # the keys the issue names, with their types
    "backend": str, "precision": str, "batch": int, "first_ms": float, "mean_ms": float, "p50_ms": float,
    "p90_ms": float, "p99_ms": float, "img_per_s": float, "provider": str,
}
FAST_BENCH = ["--iters", "3", "--warmup", "1", "--device", "cpu"]


@pytest.fixture(scope="module")
def run_and_images(squares_run, tmp_path_factory):
    pool = make_image_folder(tmp_path_factory.mktemp("bench") / "pool", train_per_class=0, val_per_class=8, seed=2)
    return squares_run.run_dir, pool / "val"


def rows_of(out: str) -> list[dict]:
    return [json.loads(line) for line in out.strip().splitlines()]


def test_json_rows_have_the_schema_and_reduced_precision_is_judged(run_and_images, cli):
    run_dir, pool = run_and_images
    result = cli("bench", run_dir, "--backend", "eager,onnxruntime", "--precision", "fp32,int8", "--batch", "1,2",
                 *FAST_BENCH, "--calib-images", pool, "--holdout", "16", "--calibration", "8", "--json")
    assert result.code == 0, result.err
    rows = rows_of(result.out)
    configs = [(r["backend"], r["precision"], r["batch"]) for r in rows]
    # batch by batch (the configurations take turns within one), eager fp32 first (the speed-up reference);
    # eager has no int8: skipped, and said so on stderr
    assert configs == [("eager", "fp32", 1), ("onnxruntime", "fp32", 1), ("onnxruntime", "int8", 1),
                       ("eager", "fp32", 2), ("onnxruntime", "fp32", 2), ("onnxruntime", "int8", 2)]
    assert "skipped eager int8: eager has no int8 path" in result.err
    for row in rows:
        for key, kind in SCHEMA.items():
            assert isinstance(row[key], kind), (key, row)
        assert row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"]
        assert row["img_per_s"] == pytest.approx(row["batch"] * 1000 / row["p50_ms"], rel=5e-3)  # the median's
        assert row["img_per_s_mean"] == pytest.approx(row["batch"] * 1000 / row["mean_ms"], rel=5e-3)
        assert row["others_cpus"] >= 0 and isinstance(row["machine_busy"], bool) and "spread" in row
        assert row["gflops"] > 0 and row["gflop_per_image"] > 0
    assert all(r["provider"] == "CPUExecutionProvider" for r in rows if r["backend"] == "onnxruntime")
    assert [r["speedup"] for r in rows if r["backend"] == "eager"] == [1.0, 1.0]
    int8 = [r for r in rows if r["precision"] == "int8"]
    # 16 held-out images: agreement measured, but too few to call the model usable (rule: >= 200)
    assert all(0.0 <= r["agreement"] <= 1.0 and r["usable"] is False and r["agreement_images"] == 16 for r in int8)
    assert "only 16 held-out images" in int8[0]["usable_reason"]
    assert all(r["agreement"] is None for r in rows if r["precision"] == "fp32")


def test_results_file_records_command_versions_device_and_settings(run_and_images, cli):
    run_dir, _ = run_and_images
    results = run_dir / "bench" / "results.jsonl"
    before = len(results.read_text().splitlines()) if results.exists() else 0
    result = cli("bench", run_dir, "--backend", "eager", "--layout", "nchw,channels_last", "--batch", "2",
                 *FAST_BENCH, "--no-plot")
    assert result.code == 0, result.err
    lines = results.read_text().splitlines()
    assert len(lines) == before + 2
    row = json.loads(lines[-1])
    assert row["command"].startswith(f"inceptionlab bench {run_dir} --backend eager --precision auto "
                                     "--layout nchw,channels_last")
    assert row["env"]["versions"]["torch"] == version("torch")  # the installed distribution, e.g. 2.14.1+cpu
    assert row["env"]["versions"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert row["env"]["device"] == "cpu" and row["env"]["torch_threads"] >= 1 and row["env"]["cpu"]
    assert row["settings"]["iters"] == 3 and row["settings"]["warmup"] == 1 and row["settings"]["batches"] == [2]
    assert row["weights_sha256"] and row["input_shape"] == [3, 75, 75] and row["run_id"]
    assert {json.loads(line)["layout"] for line in lines[-2:]} == {"nchw", "channels_last"}


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BENCH_PLOTS = ("bench_latency.png", "bench_throughput.png")


def is_png(path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG_SIGNATURE


def test_table_compares_against_eager_fp32_and_plots_are_drawn(run_and_images, cli):
    run_dir, _ = run_and_images
    plots = run_dir / "plots"
    for name in BENCH_PLOTS:  # an earlier test's bench drew them too: they must come from this call
        (plots / name).unlink(missing_ok=True)
    result = cli("bench", run_dir, "--backend", "eager,onnxruntime", "--batch", "1", *FAST_BENCH)
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].startswith("resnet18 at 75 px") and "GFLOP/image" in lines[0] and "load average" in lines[0]
    assert "speed-up" in lines[1] and "p99 ms" in lines[1] and "GFLOP/s" in lines[1]
    eager = next(line for line in lines if line.startswith("eager"))
    assert "1.00x" in eager
    assert any(line.startswith("onnxruntime") and "CPUExecutionProvider" in line for line in lines)
    for name in BENCH_PLOTS:
        assert is_png(plots / name)
        (plots / name).unlink()  # `plot` redraws them from bench/results.jsonl alone
    replot = cli("plot", run_dir)
    assert replot.code == 0, replot.err
    redrawn = replot.out.splitlines()
    for name in BENCH_PLOTS:
        assert str(plots / name) in redrawn and is_png(plots / name)


def test_table_marks_values_that_do_not_apply():
    from inceptionlab.infer.bench import format_table

    row = {"backend": "onnxruntime", "precision": "int8", "layout": "native", "batch": 1, "first_ms": 3.0,
           "mean_ms": 2.0, "p50_ms": 2.0, "p90_ms": 2.5, "p99_ms": 3.0, "img_per_s": 500.0, "gflops": None,
           "speedup": None, "agreement": 0.97, "usable": False, "provider": "CPUExecutionProvider"}
    header, _, line, key = format_table([row]).splitlines()
    assert line.split()[10:] == ["-", "-", "-", "-", "97.0%", "NO", "CPUExecutionProvider"]
    assert len(line) == len(header) + len("CPUExecutionProvider") - len("provider")


def test_bench_plot_draws_only_the_latest_call(tmp_path):
    from inceptionlab.bench_plots import latest_run, plot_bench

    base = {"backend": "eager", "precision": "fp32", "layout": "nchw", "p50_ms": 10.0, "p90_ms": 12.0,
            "img_per_s": 100.0, "model": "m", "input_shape": [3, 8, 8]}
    rows = [{**base, "batch": 1, "run_id": "a"}, {**base, "batch": 1, "run_id": "b"}, {**base, "batch": 4, "run_id": "b"}]
    assert [r["batch"] for r in latest_run(rows)] == [1, 4]

    def drawn(rows: list[dict], name: str) -> list[bytes]:
        results = tmp_path / f"{name}.jsonl"
        results.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"cut by a cra')
        paths = plot_bench(results, tmp_path / name)
        assert [p.name for p in paths] == list(BENCH_PLOTS) and all(is_png(p) for p in paths)
        return [p.read_bytes() for p in paths]

    # The same pictures as from the latest call's rows alone; those rows changed, the pictures change.
    assert drawn(rows, "all") == drawn(rows[1:], "latest")
    assert drawn(rows, "all") != drawn([rows[0], *({**r, "p50_ms": 11.0} for r in rows[1:])], "changed")
    assert plot_bench(tmp_path / "absent.jsonl", tmp_path / "plots") == []


@pytest.mark.parametrize("args,words", [
    (["--backend", "tensorflow"], "--backend tensorflow: use a comma list of eager, compile"),
    (["--precision", "int4"], "--precision int4"),
    (["--batch", "0"], "--batch 0"),
    (["--batch", "one"], "--batch one"),
    (["--layout", "nhwc"], "--layout nhwc"),
    (["--device", "tpu"], "--device 'tpu'"),
    (["--backend", "onnxruntime", "--provider", "tpu", "--device", "cpu"], "--provider 'tpu'"),
    # --out places a --model's export; with a run it was ignored (the run's export is RUN/exports/)
    (["--out", "elsewhere"], "--out elsewhere: a run's export goes to"),
])
def test_bad_options_are_one_line_errors(run_and_images, cli, args, words):
    run_dir, _ = run_and_images
    result = cli("bench", run_dir, "--iters", "1", "--no-plot", *args)
    assert result.code == 2, result.err
    assert words in result.err and len(result.err.strip().splitlines()) == 1


def test_auto_backend_benches_what_serve_runs_here(run_and_images, cli):
    """`--backend auto` is the runtime `serve --backend auto` serves on here (OpenVINO, else ONNX Runtime,
    on a CPU; eager on a GPU): the user who asks how fast the server's model is needs no other name."""
    from inceptionlab.infer.runtimes import auto_backend

    run_dir, _ = run_and_images
    result = cli("bench", run_dir, "--backend", "auto,eager", "--precision", "fp32", "--batch", "1", *FAST_BENCH,
                 "--no-plot", "--json")
    assert result.code == 0, result.err
    assert {row["backend"] for row in rows_of(result.out)} == {"eager", auto_backend("cpu", "image")}


def test_nothing_measurable_is_an_error(run_and_images, cli):
    run_dir, _ = run_and_images
    result = cli("bench", run_dir, "--backend", "eager", "--precision", "int8", *FAST_BENCH, "--no-plot")
    assert result.code == 2 and "nothing could be measured" in result.err


def test_list_shows_runtimes_and_providers(cli):
    result = cli("bench", "--list", "--json")
    assert result.code == 0, result.err
    rows = {r["backend"]: r for r in rows_of(result.out)}
    assert rows["onnxruntime"]["available"] and "CPUExecutionProvider" in rows["onnxruntime"]["details"]
    assert rows["eager"]["precisions"] == ["fp32", "bf16", "fp16"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_bench_on_the_gpu_reports_the_gpu(run_and_images, cli):
    run_dir, _ = run_and_images
    result = cli("bench", run_dir, "--backend", "eager", "--precision", "fp32,fp16", "--batch", "1,4",
                 "--iters", "3", "--warmup", "1", "--device", "cuda", "--json", "--no-plot")
    assert result.code == 0, result.err
    rows = rows_of(result.out)
    assert all("cuda" in r["provider"] for r in rows)
