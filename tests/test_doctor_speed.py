"""`inceptionlab doctor`'s speed-settings table: what `auto` picks on each device, and why."""

from __future__ import annotations

import json

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
