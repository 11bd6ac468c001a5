"""The dynamic batcher alone (Triton's semantics), with a recording run function: no model, fast."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from inceptionlab.queueing import BatchRule
from inceptionlab.serve.batcher import DynamicBatcher, QueueFull


class Recorder:
    """A run function that remembers each batch's request sizes; `gate` holds executions back."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, instance: int, items):
        self.gate.wait(timeout=10)
        self.batches.append([len(i) for i in items])
        return [i * 2 for i in items]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


def test_requests_arriving_together_share_one_batch_of_at_most_max_batch():
    async def main():
        recorder = Recorder()
        batcher = DynamicBatcher(recorder, max_batch=8, max_delay_s=0.5, max_queue=100)
        batcher.start()
        items = [np.full((2, 1), i) for i in range(6)]  # 12 items: one full batch of 8, then 4
        results = await asyncio.gather(*(batcher.submit(item, 2) for item in items))
        await batcher.stop()
        return recorder.batches, results, items

    batches, results, items = run(main())
    assert [sum(b) for b in batches] == [8, 4]
    for got, item in zip(results, items):  # each request gets its own rows back
        np.testing.assert_array_equal(got, item * 2)


def test_a_lone_request_waits_at_most_max_delay():
    async def main():
        batcher = DynamicBatcher(Recorder(), max_batch=32, max_delay_s=0.05, max_queue=10)
        batcher.start()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await batcher.submit(np.zeros((1, 1)), 1)
        waited = loop.time() - started
        await batcher.stop()
        return waited

    assert 0.04 <= run(main()) < 1.0  # the delay, not the 32-item batch that never fills


def test_full_queue_refuses_and_oversized_request_is_an_error():
    async def main():
        recorder = Recorder()
        recorder.gate.clear()  # the first batch blocks: later requests pile up in the queue
        batcher = DynamicBatcher(recorder, max_batch=1, max_delay_s=0, max_queue=2)
        batcher.start()
        first = asyncio.create_task(batcher.submit(np.zeros((1, 1)), 1))
        while batcher.executing == 0:
            await asyncio.sleep(0)
        queued = [asyncio.create_task(batcher.submit(np.zeros((1, 1)), 1)) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(QueueFull):
            await batcher.submit(np.zeros((1, 1)), 1)
        with pytest.raises(ValueError, match="max-batch"):
            await batcher.submit(np.zeros((2, 1)), 2)
        recorder.gate.set()
        answered = await asyncio.gather(first, *queued)
        await batcher.stop()
        return answered

    assert len(run(main())) == 3  # every accepted request answered


def test_timed_out_request_is_dropped_from_the_queue_and_drain_waits_for_the_rest():
    async def main():
        recorder = Recorder()
        recorder.gate.clear()
        batcher = DynamicBatcher(recorder, max_batch=1, max_delay_s=0, max_queue=10)
        batcher.start()
        running = asyncio.create_task(batcher.submit(np.zeros((1, 1)), 1))
        while batcher.executing == 0:
            await asyncio.sleep(0)
        with pytest.raises(asyncio.TimeoutError):
            await batcher.submit(np.full((1, 1), 7), 1, timeout_s=0.01)
        waiting = asyncio.create_task(batcher.submit(np.ones((1, 1)), 1))
        await asyncio.sleep(0)
        drain = asyncio.create_task(batcher.drain(timeout_s=10))
        await asyncio.sleep(0)
        assert not drain.done()
        recorder.gate.set()
        drained = await drain
        results = await asyncio.gather(running, waiting)
        await batcher.stop()
        return drained, recorder.batches, results

    drained, batches, results = run(main())
    assert drained and batches == [[1], [1]]  # the timed-out request never ran
    np.testing.assert_array_equal(results[1], np.full((1, 1), 2))


def test_engine_pads_to_the_bucket_and_returns_only_the_real_rows():
    from inceptionlab.infer.batching import batch_buckets
    from inceptionlab.serve.models import Engine

    class Doubling:  # a RuntimeSession stand-in that records the batch sizes it ran
        def __init__(self):
            self.sizes = []

        def place(self, x):
            return x

        def run(self, x):
            self.sizes.append(len(x))
            return x * 2

        def to_numpy(self, x):
            return x

    session = Doubling()
    engine = Engine({b: session for b in batch_buckets(8)}, batch_buckets(8))
    out = engine.run(np.arange(5, dtype=np.float32).reshape(5, 1))
    assert session.sizes == [8] and out.shape == (5, 1)
    np.testing.assert_array_equal(out[:, 0], [0, 2, 4, 6, 8])
    assert batch_buckets(8) == [1, 2, 4, 8] and batch_buckets(12) == [1, 2, 4, 8, 12]


def test_a_request_over_max_batch_but_within_max_request_runs_alone_and_the_rest_still_batch():
    async def main():
        recorder = Recorder()
        recorder.gate.clear()  # everything queues behind the first batch, then the order is known
        batcher = DynamicBatcher(recorder, max_batch=2, max_delay_s=0, max_queue=10, max_request=5)
        batcher.start()
        first = asyncio.create_task(batcher.submit(np.zeros((1, 1)), 1))
        while batcher.executing == 0:
            await asyncio.sleep(0)
        sizes = [1, 5, 1, 1]
        queued = [asyncio.create_task(batcher.submit(np.full((n, 1), n), n)) for n in sizes]
        await asyncio.sleep(0)
        with pytest.raises(ValueError, match=r"6 items exceeds 5, the most one request holds with --max-batch auto"):
            await batcher.submit(np.zeros((6, 1)), 6)
        recorder.gate.set()
        results = await asyncio.gather(first, *queued)
        await batcher.stop()
        return recorder.batches, results

    batches, results = run(main())
    assert batches == [[1], [1], [5], [1, 1]]  # the 5 alone, between the batches it did not fit in
    assert [len(r) for r in results] == [1, 1, 5, 1, 1]


def test_engine_runs_a_request_over_its_largest_bucket_as_consecutive_full_batches():
    from inceptionlab.serve.models import Engine

    sizes = []

    class Doubling:
        def place(self, x):
            return x

        def run(self, x):
            sizes.append(len(x))
            return x * 2

        def to_numpy(self, x):
            return x

    engine = Engine({1: Doubling(), 2: Doubling()}, [1, 2])
    out = engine.run(np.arange(5, dtype=np.float32).reshape(5, 1))
    assert sizes == [2, 2, 1] and out[:, 0].tolist() == [0, 2, 4, 6, 8]


# --------------------------------------------------------------------------- the rule, on a simulated clock


class Clock:
    """The batcher's clock, set by the test: arrival times and the delay are read from it, never the wall."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# Below 50 requests/s a request runs at once; above, the batcher waits for 4 (at most a minute by the clock,
# which the tests never let pass by itself: a wait that was not asked for would hang, not pass).
RULE = BatchRule(8, 60.0, ((50.0, 1), (1e9, 4)))


def test_under_a_light_load_a_lone_request_runs_at_once_whatever_the_delay():
    async def main():
        recorder, clock = Recorder(), Clock()
        batcher = DynamicBatcher(recorder, max_batch=8, max_delay_s=60.0, max_queue=10, rule=RULE, clock=clock)
        batcher.start()
        for second in range(4):  # one request a second
            clock.now = float(second)
            await asyncio.wait_for(batcher.submit(np.zeros((1, 1)), 1), 10)
        await batcher.stop()
        return recorder.batches

    assert run(main()) == [[1]] * 4


def test_as_the_rate_grows_a_free_instance_waits_for_the_rules_batch():
    async def main():
        recorder, clock = Recorder(), Clock()
        first_done = asyncio.Event()
        recorder.gate.clear()  # the first request's batch runs until the test opens the gate
        batcher = DynamicBatcher(recorder, max_batch=8, max_delay_s=60.0, max_queue=10, rule=RULE, clock=clock,
                                 on_batch=lambda stats: first_done.set())
        batcher.start()
        first = asyncio.create_task(batcher.submit(np.zeros((1, 1)), 1))  # no rate yet: runs at once
        while batcher.executing == 0:
            await asyncio.sleep(0)
        queued = []
        for i in range(1, 4):  # 1,000 requests/s by the clock, queued behind the running batch
            clock.now = i * 0.001
            queued.append(asyncio.create_task(batcher.submit(np.zeros((1, 1)), 1)))
            await asyncio.sleep(0)
        recorder.gate.set()
        await first
        await first_done.wait()  # the worker has gone back for its next batch and is waiting in it
        waiting = (batcher.executing, len(batcher.queue))
        clock.now = 0.004
        fourth = asyncio.create_task(batcher.submit(np.zeros((1, 1)), 1))
        await asyncio.wait_for(asyncio.gather(*queued, fourth), 10)
        await batcher.stop()
        return waiting, recorder.batches

    waiting, batches = run(main())
    assert waiting == (0, 3)  # three queued, none taken: the rule asks for 4 at this rate
    assert batches == [[1], [1, 1, 1, 1]]


def test_a_request_waits_for_the_rules_batch_no_longer_than_the_delay():
    rule = BatchRule(8, 60.0, ((0.001, 1), (1e9, 8)))  # above 0.001 requests/s: wait for 8

    async def main():
        recorder, clock = Recorder(), Clock()
        recorder.gate.clear()
        batches_done = asyncio.Event()
        batcher = DynamicBatcher(recorder, max_batch=8, max_delay_s=60.0, max_queue=10, rule=rule, clock=clock,
                                 on_batch=lambda stats: batches_done.set())
        batcher.start()
        first = asyncio.create_task(batcher.submit(np.zeros((1, 1)), 1))
        while batcher.executing == 0:
            await asyncio.sleep(0)
        clock.now = 1.0
        second = asyncio.create_task(batcher.submit(np.zeros((1, 1)), 1))
        await asyncio.sleep(0)
        recorder.gate.set()
        await first
        await batches_done.wait()
        waited = (batcher.executing, len(batcher.queue))  # 2 arrivals in 1 s: 1 request/s, wait for 8
        clock.now = 61.5  # past the second request's minute; the third one's arrival wakes the worker
        third = asyncio.create_task(batcher.submit(np.zeros((1, 1)), 1))
        await asyncio.wait_for(asyncio.gather(second, third), 10)
        await batcher.stop()
        return waited, recorder.batches

    waited, batches = run(main())
    assert waited == (0, 1) and batches == [[1], [1, 1]]  # the rule still asks for 8; the delay is over


def test_the_batcher_and_the_simulation_take_the_same_batches_on_one_schedule():
    """queueing.schedule (what the plan simulates) and the batcher (what serves) apply one rule: the same
    arrivals, with batches that take no time, give the same batches."""
    from inceptionlab import queueing

    rule = queueing.BatchRule.for_cores(queueing.BatchTimes(0.0025, 0.0457, 32), queueing.Cores(2, 2, 0.0025), 2,
                                        3600.0)
    quiet = [float(t) for t in range(20)]
    busy = [20.0 + t for t in queueing.poisson_arrivals(2000.0, 300, seed=5)]
    arrivals = quiet + busy + [busy[-1] + 1.0 + t for t in range(20)]  # quiet again: the last ones flush

    async def main():
        recorder, clock = Recorder(), Clock()
        batcher = DynamicBatcher(recorder, max_batch=32, max_delay_s=3600.0, max_queue=1000, rule=rule, clock=clock)
        batcher.start()
        pending = []
        for at in arrivals:
            clock.now = at
            pending.append(asyncio.create_task(batcher.submit(np.zeros((1, 1)), 1)))
            # Until the worker has seen this arrival (it clears the arrival flag only once it waits again,
            # after looking at the queue) and finished any batch it took (its run takes no time, in a thread).
            for _ in range(10_000):
                await asyncio.sleep(0)
                if batcher.executing == 0 and not batcher._arrival.is_set():
                    break
        await asyncio.wait_for(asyncio.gather(*pending), 10)
        await batcher.stop()
        return [sum(batch) for batch in recorder.batches]

    _, simulated = queueing.schedule(arrivals, 1, queueing.BatchTimes(0.0, 0.0, 32), rule)
    served = run(main())
    assert served == simulated and max(served) > 1
