"""`inceptionlab doctor`'s speed-settings table: what `auto` picks on each device, and why."""

from __future__ import annotations

import json
from dataclasses import replace

from helpers.page_examples import check_example
from test_hardware import ZEN3, ZEN4, decide_for

from inceptionlab import hardware
from inceptionlab.doctor import speed as doctor_speed


def test_doctor_shows_what_auto_picks_for_training_and_serving(cli):
    result = cli("doctor", "--json")
    report = json.loads(result.out)
    rows = report["speed_settings"]
    assert [row["workload"] for row in rows if row["device"] == "cpu"] == [w.label for w in doctor_speed.WORKLOADS]
    assert all(row["label"] for row in rows)  # a choice on every row, with how it was decided
    text = cli("doctor").out
    assert "speed settings on this machine" in text and "train demo/digits" in text


def test_calibrate_measures_afresh_and_never_picks_an_emulated_precision(monkeypatch, tmp_path):
    monkeypatch.setenv("INCEPTIONLAB_AUTO", "measure")
    small = doctor_speed.Workload("train cifar10/small_cnn", "train", "cifar10/small_cnn")
    monkeypatch.setattr(doctor_speed, "WORKLOADS", (small,))
    cache = hardware.SpeedCache(tmp_path)
    before = doctor_speed.speed_settings(["cpu"], calibrate=False, cache=cache)[0].decision
    assert before.source == "probe" and before.img_per_s == {}  # nothing measured yet: the probe's pick
    measured = doctor_speed.speed_settings(["cpu"], calibrate=True, cache=cache)[0].decision
    assert measured.source == "measured" and set(measured.img_per_s) == set(measured.candidates)
    if not hardware.cpu_facts().bf16:
        assert measured.choice.precision == "fp32" and not any(c.startswith("bf16") for c in measured.candidates)
    recalled = doctor_speed.speed_settings(["cpu"], calibrate=False, cache=cache)[0].decision
    assert recalled.source == "cached" and recalled.choice == measured.choice


def test_the_speed_settings_pages_tables_are_what_doctor_prints():
    """The page's two tables (a CPU capped to AVX2, the same CPU with bf16 units), from its measured figures
    (3.16 and 2.94 img/s print as 3.2 and 2.9: within CLEAR_MARGIN, the safe nchw is kept)."""
    figures = {ZEN3: [{"fp32 channels_last": 84.2, "fp32 nchw": 69.7}, {"fp32 channels_last": 3.16, "fp32 nchw": 2.94},
                      {"fp32 channels_last": 11.8, "fp32 nchw": 8.0}],
               ZEN4: [{"bf16 channels_last": 90.8, "bf16 nchw": 79.8, "fp32 channels_last": 78.3, "fp32 nchw": 66.8},
                      {"bf16 channels_last": 5.5, "bf16 nchw": 4.4, "fp32 channels_last": 3.4, "fp32 nchw": 3.2},
                      {"bf16 channels_last": 17.8, "fp32 channels_last": 11.5, "bf16 nchw": 11.2, "fp32 nchw": 8.7}]}
    def table(facts) -> str:
        rows = []
        for workload, rates in zip(doctor_speed.WORKLOADS, figures[facts]):
            decision, _ = decide_for(facts, rates)
            batch = 2 if workload.recipe == "inception_v3/tiny_imagenet_fast" else None  # timed at a smaller batch
            rows.append(doctor_speed.SpeedRow("cpu", workload.label, replace(decision, batch=batch)))
        return "\n".join(doctor_speed.format_rows(rows))

    check_example("speed-settings-doctor-avx2", table(ZEN3))
    check_example("speed-settings-doctor-bf16", table(ZEN4))
