"""`serve --max-batch auto`: the warmed buckets are kept only when the largest pays (models.choose_max_batch)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from inceptionlab.serve.models import BATCHING_PAYS, Engine, choose_max_batch


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class CostedSession:
    """A session whose run advances the clock by fixed + per_item * batch seconds."""

    provider = "fake"

    def __init__(self, clock: FakeClock, fixed: float, per_item: float):
        self.clock, self.fixed, self.per_item = clock, fixed, per_item
        self.sizes: list[int] = []

    def place(self, inputs):
        return inputs

    def run(self, inputs):
        self.sizes.append(len(inputs))
        self.clock.now += self.fixed + self.per_item * len(inputs)
        return inputs.reshape(len(inputs), -1)[:, :2]

    def to_numpy(self, outputs):
        return outputs


def served_with(session: CostedSession, buckets=(1, 2, 4, 8), instances: int = 2) -> SimpleNamespace:
    engines = [Engine({b: session for b in buckets}, list(buckets)) for _ in range(instances)]
    return SimpleNamespace(engines=engines, buckets=list(buckets), input_shape=[3, 4, 4], is_image=True,
                           max_batch=buckets[-1])


@pytest.mark.parametrize("fixed, per_item, batched", [
    (0.010, 0.001, True),    # per-call cost dominates (a GPU): batch 8 is 18 ms vs 8 x 11 ms
    (0.000, 0.010, False),   # per-image cost only (this 2-core CPU): batch 8 is no faster per image
    (0.002, 0.010, False),   # 1.2x per image: below BATCHING_PAYS
])
def test_batching_is_kept_only_when_the_largest_batch_pays(fixed, per_item, batched):
    clock = FakeClock()
    session = CostedSession(clock, fixed, per_item)
    served = served_with(session)
    note = choose_max_batch(served, clock=clock)
    gain = (fixed + per_item) * 8 / (fixed + per_item * 8)
    assert (gain >= BATCHING_PAYS) == batched
    assert f"{gain:.2f}x" in note
    assert sorted(set(session.sizes)) == [1, 8]  # it timed batch 1 and the largest bucket only
    if batched:
        assert served.max_batch == 8 and all(e.buckets == [1, 2, 4, 8] for e in served.engines)
    else:
        assert served.max_batch == 1 and all(e.buckets == [1] for e in served.engines)
        assert "serving unbatched" in note
        out = served.engines[1].run(np.ones((1, 3, 4, 4), np.float32))  # what is left still runs
        assert out.shape == (1, 2)


def test_a_single_bucket_is_left_alone():
    clock = FakeClock()
    session = CostedSession(clock, 0.0, 0.01)
    served = served_with(session, buckets=(1,))
    assert choose_max_batch(served, clock=clock) == "batch 1 only" and session.sizes == []
