"""The evaluation meter against brute-force counting: loss weighting, top-k, confusion, bad labels."""

from __future__ import annotations

import pytest
import torch

from inceptionlab.metrics import ClassificationMeter


def test_meter_matches_brute_force_over_uneven_batches():
    torch.manual_seed(0)
    logits, targets = torch.randn(103, 7), torch.randint(0, 7, (103,))
    meter = ClassificationMeter(7, confusion=True)
    losses = []
    for chunk in (slice(0, 50), slice(50, 100), slice(100, 103)):  # the last batch holds 3
        loss = torch.nn.functional.cross_entropy(logits[chunk], targets[chunk])
        meter.update(logits[chunk], targets[chunk], loss)
        losses.append(loss * (chunk.stop - chunk.start))
    result = meter.compute()
    assert result["loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(logits, targets)), rel=1e-6)
    assert result["loss"] == pytest.approx(float(sum(losses) / 103), rel=1e-6)
    ranks = logits.argsort(dim=1, descending=True)
    assert result["top1"] == pytest.approx(float((ranks[:, 0] == targets).float().mean()))
    assert result["top5"] == pytest.approx(float((ranks[:, :5] == targets[:, None]).any(1).float().mean()))
    expected = torch.zeros(7, 7, dtype=torch.long)
    for t, p in zip(targets, ranks[:, 0]):
        expected[t, p] += 1
    assert torch.equal(result["confusion"], expected) and result["samples"] == 103
    assert result["per_class"][3] == pytest.approx(float(expected[3, 3] / expected[3].sum()))


def test_absent_class_has_no_accuracy_and_bad_labels_are_refused():
    meter = ClassificationMeter(3, confusion=True)
    meter.update(torch.tensor([[2.0, 0, 0], [0, 2.0, 0]]), torch.tensor([0, 0]), torch.tensor(0.5))
    result = meter.compute()
    assert result["per_class"] == [0.5, None, None] and result["top5"] == 1.0  # top-3 of 3 classes
    # Labels are checked on the device (no per-batch host sync) and refused when the totals are read.
    meter.update(torch.zeros(2, 3), torch.tensor([3, -1]), torch.tensor(0.0))
    with pytest.raises(ValueError, match="2 target labels are outside"):
        meter.compute()
