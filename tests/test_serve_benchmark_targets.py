"""benchmarks/serve.py's targets, on rows shaped like its own (figures from a run on an AMD EPYC, Zen 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def serve_benchmark(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # its sibling modules (_results, _servers)
    import serve

    return serve


def row(config: str, protocol: str, plan: str, best_rate: float) -> dict:
    return {"model": "demo", "config": config, "protocol": protocol, "plan": plan, "best_rate": best_rate,
            "sat_tensor_per_s": 100.0}


def auto_target(serve_benchmark, rows):
    (check,) = [c for c in serve_benchmark.targets(rows, []) if "auto's rate" in c["target"]]
    return check


def test_auto_serving_the_best_fixed_plan_holds_it_whatever_the_two_sweeps_found(serve_benchmark):
    rows = [row("1x32", "grpc", "1x32, 1 ms", 70.6), row("2x1", "grpc", "2x1, 0 ms", 78.2),
            row("auto", "grpc", "2x1, 0 ms", 70.6)]
    check = auto_target(serve_benchmark, rows)
    assert check["held"] and "auto chose that plan" in check["measured"]


def test_auto_serving_another_plan_must_reach_the_best_rate(serve_benchmark):
    rows = [row("2x1", "grpc", "2x1, 0 ms", 78.2), row("auto", "grpc", "1x32, 1 ms", 70.6)]
    check = auto_target(serve_benchmark, rows)
    assert not check["held"] and "chose" not in check["measured"]
    rows[-1]["best_rate"] = 78.2
    assert auto_target(serve_benchmark, rows)["held"]


def sweeps(*rates: float) -> dict:
    return {"served_as": {}, "sweeps": [{"best_rate": rate} for rate in rates]}


def test_the_peer_target_is_autos_and_fixed_plans_beside_the_peer_are_not_judged(serve_benchmark):
    """--peer-configs runs fixed plans beside auto and the peer: the 2x target reads auto's rates against
    the peer's, whatever order the servers ran in (rates from a run on an AMD EPYC, Zen 3)."""
    comparison = {"model": "demo", "peer": "litserve",
                  "servers": {"inceptionlab 2x32": sweeps(47.1, 40.5), "inceptionlab": sweeps(42.6, 33.0),
                              "litserve": sweeps(18.0, 17.1)}}
    (check,) = [c for c in serve_benchmark.targets([], [comparison]) if "litserve" in c["target"]]
    assert check["measured"] == "42.6/s vs 18.0/s (2.37x), 33.0/s vs 17.1/s (1.93x)" and not check["held"]
    comparison["servers"]["inceptionlab"] = sweeps(42.6, 40.5)
    assert [c for c in serve_benchmark.targets([], [comparison]) if "litserve" in c["target"]][0]["held"]


def test_a_side_by_side_run_without_auto_has_no_peer_target(serve_benchmark):
    comparison = {"model": "demo", "peer": "litserve",
                  "servers": {"inceptionlab 2x32": sweeps(47.1), "litserve": sweeps(18.0)}}
    assert serve_benchmark.targets([], [comparison]) == []


def swept(*tried: tuple[float, bool]) -> dict:
    """One sweep as run_sweep returns it: the rates tried, whether each held, the best that held."""
    held = [rate for rate, ok in tried if ok]
    return {"rows": [{"rate": rate, "slo_met": ok} for rate, ok in tried], "best_rate": max(held) if held else None}


def test_a_peer_repetition_that_held_no_rate_reads_as_below_the_lowest_tried_not_as_zero(serve_benchmark):
    """LitServe's first repetition on an AMD EPYC (Zen 4) missed the SLO at every rate the sweep tried
    (89.5 down to 26.5/s): its rate is below 26.5/s, and ours against it at least 2.90x, not infinitely
    more; its table cell says "<26.5" and the median counts it as 26.5 (an upper bound)."""
    ours = {"served_as": {"instances": 1, "max_batch": 32, "max_delay_ms": 1.0, "backend": "openvino", "precision": "bf16"},
            "low_load": {"p50_ms": 18.7, "p99_ms": 34.2},
            "sweeps": [swept((89.5, False), (59.67, True), (73.08, True), (76.88, True)),
                       swept((89.5, False), (85.08, True))]}
    peer = {"served_as": {"instances": 1, "max_batch": 1, "max_delay_ms": None, "backend": "litserve onnxruntime",
                          "precision": "fp32"},
            "low_load": {"p50_ms": 27.7, "p99_ms": 75.2},
            "sweeps": [swept((89.5, False), (59.67, False), (39.78, False), (26.52, False)),
                       swept((89.5, False), (37.81, True))]}
    comparison = {"model": "demo", "peer": "litserve", "servers": {"inceptionlab": ours, "litserve": peer},
                  "loadavg_before": [1.7], "loadavg_after": [2.2]}
    (check,) = [c for c in serve_benchmark.targets([], [comparison]) if "litserve" in c["target"]]
    assert check["measured"] == "76.9/s vs <26.5/s (>2.90x), 85.1/s vs 37.8/s (2.25x)" and check["held"]
    litserve = next(r for r in serve_benchmark.peer_rows([comparison]) if r["config"].startswith("litserve"))
    assert litserve["rates"] == ["<26.5", 37.81] and litserve["best_rate"] == pytest.approx((26.52 + 37.81) / 2)
    from _results import cell  # benchmarks/, on the path the fixture set

    assert cell(litserve["rates"], ".1f") == "<26.5, 37.8"


def test_grpc_saturation_must_reach_https_within_the_noise_of_two_closed_loop_runs(serve_benchmark):
    """Inception v3 at 299 px, 1 x 32, on an AMD EPYC (Zen 4): 12.6/s over gRPC against 14.8/s over HTTP
    is within what two runs of one plan differ by; a gRPC front end at two thirds of HTTP's is not."""
    rows = [{**row("1x32", "http", "1x32, 5.5 ms", 10.2), "sat_tensor_per_s": 14.8},
            {**row("1x32", "grpc", "1x32, 5.5 ms", 9.7), "sat_tensor_per_s": 12.6}]
    (check,) = [c for c in serve_benchmark.targets(rows, []) if "gRPC saturation" in c["target"]]
    assert check["held"] and check["measured"] == "gRPC 12.6/s, HTTP 14.8/s (0.85x)"
    rows[1]["sat_tensor_per_s"] = 9.9
    (check,) = [c for c in serve_benchmark.targets(rows, []) if "gRPC saturation" in c["target"]]
    assert not check["held"]


@pytest.mark.parametrize("precision, one_epoch", [("auto", False), ("fp32", True)])
def test_the_demo_the_benchmark_trains_is_the_one_make_demo_gives_when_auto_picks_the_precision(
        serve_benchmark, monkeypatch, tmp_path, precision, one_epoch):
    """Under --precision auto the weights decide the precision served (bf16 must agree with fp32): on a Zen 4
    the one-epoch demo agreed on 97.5% and was served fp32 where `make demo`'s run (99.5%) is served bf16.
    The benchmark's own demo run is trained as `make demo` trains it then; with a pinned precision, one
    epoch (latency no longer depends on the weights)."""
    commands = []

    def train(command, **kwargs):
        commands.append(command)
        run = tmp_path / "demo-run" / "demo" / "digits" / "20261127-000000"
        run.mkdir(parents=True)
        (run / "model.pt").write_bytes(b"weights")

    monkeypatch.setattr(serve_benchmark.subprocess, "run", train)
    args = serve_benchmark.argparse.Namespace(demo_run=None, out=tmp_path, precision=precision)
    assert serve_benchmark.demo_run(args) == tmp_path / "demo-run" / "demo" / "digits" / "20261127-000000"
    (command,) = commands
    assert command[1:4] == ["-m", "inceptionlab", "demo"]
    assert ("train.epochs=1" in command) is one_epoch
    assert serve_benchmark.demo_run(args) and len(commands) == 1  # trained once: the next run reuses it


def test_the_prediction_is_read_from_the_start_up_line_the_server_prints(serve_benchmark):
    """The benchmark reads the chosen plan's predicted rate from the server's log: the line as
    hardware.ServeDecision writes it (figures like the demo model's on a 2-core CPU)."""
    from inceptionlab import hardware

    figures = {"1x1": 400.0, "1x32": 700.0, "2x1": 465.0, "2x32": 989.0}
    decision = hardware.decide_serving(hardware.serve_plans(2, False, None, None), lambda plan, s: figures[plan.label],
                                       cpus=2, gpu=False, host=hardware.HostWork(0.0025, "a 773x512 JPEG"))
    log_text = f"agreement images: ...\nserving demo: inception_v3 ... warmed in 0.6 s; {decision.line()}\nready: ...\n"
    found = serve_benchmark.predicted(log_text)
    assert found == {"plan": decision.plan.label, "rate": decision.latency[decision.plan.label].rate}
    pinned = hardware.decide_serving([hardware.ServePlan(1, 4)], None, cpus=2, gpu=False, delay_ms=2.0)
    assert serve_benchmark.predicted(f"serving demo: ...; {pinned.line()}\n") is None  # nothing simulated


def raw_comparison(auto: list[float], unbatched: list[float], peer: list[float], predicted: float | None) -> dict:
    served = {"instances": 1, "max_batch": 32, "max_delay_ms": 10.0, "backend": "openvino", "precision": "bf16",
              "predicted": {"plan": "1x32", "rate": predicted} if predicted else None}
    record = lambda rates, body, as_served: {"served_as": as_served, "body": body,  # noqa: E731
                                             "low_load": {"p50_ms": 5.0, "p99_ms": 9.0},
                                             "sweeps": [{"best_rate": r, "rows": [{"rate": r}]} for r in rates]}
    return {"model": "demo", "body": "raw", "peer": "litserve", "loadavg_before": [0.5], "loadavg_after": [0.9],
            "servers": {"inceptionlab": record(auto, "raw", served),
                        "inceptionlab max-batch-1": record(unbatched, "raw", {**served, "max_batch": 1,
                                                                              "predicted": None}),
                        "litserve": record(peer, "multipart", {**served, "backend": "litserve onnxruntime",
                                                               "predicted": None})}}


def test_raw_bodies_are_judged_against_the_peers_multipart_the_unbatched_server_and_the_prediction(serve_benchmark):
    comparison = raw_comparison([240.0, 250.0, 236.0], [170.0, 180.0, 175.0], [117.0, 117.0, 110.0], 230.0)
    checks = {c["target"]: c for c in serve_benchmark.targets([], [comparison])}
    peer = checks["demo, raw image bodies: inceptionlab's SLO rate >= 2x litserve's (multipart), every repetition"]
    assert peer["held"] and peer["applies"] and peer["measured"].startswith("240.0/s vs 117.0/s (2.05x)")
    batching = checks["demo, raw image bodies: inceptionlab's SLO rate >= 1.3x with --max-batch 1, every repetition"]
    assert batching["held"] and batching["applies"]
    prediction = checks["demo, raw image bodies: the start-up line's predicted rate within 20% of the measured one"]
    assert prediction["held"] and prediction["measured"] == "1x32 predicted 230.0/s, measured 240.0/s (+4%)"
    # one repetition short of 1.3x fails batching; a prediction 30% high fails the prediction
    comparison = raw_comparison([240.0, 220.0, 236.0], [170.0, 180.0, 175.0], [117.0, 117.0, 110.0], 340.0)
    checks = {c["target"]: c["held"] for c in serve_benchmark.targets([], [comparison])}
    assert [held for target, held in checks.items() if "max-batch" in target] == [False]
    assert [held for target, held in checks.items() if "predicted" in target] == [False]
    # the peer's multipart record is its own row, not repeated under our raw bodies
    rows = serve_benchmark.peer_rows([comparison])
    assert [r["config"] for r in rows] == ["inceptionlab, raw image bodies", "inceptionlab max-batch-1, raw image bodies"]
    assert rows[0]["predicted_rate"] == 340.0 and rows[1]["predicted_rate"] is None
