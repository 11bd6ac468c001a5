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
