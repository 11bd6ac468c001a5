"""Dynamic batching on asyncio, computing in worker threads, by queueing.BatchRule.

- A free instance takes what is queued (up to `max_batch` items) as soon as the queue holds the
  batch the rule asks for at the current arrival rate: under a light load one request, which
  then runs at once; as the rate grows, the batch that the measured batch-time curve says keeps
  the cores from overloading. A request waits at most `max_delay` (from when the OLDEST request
  of the batch arrived) for that batch to fill. Without a curve (`BatchRule.full`) the batch to
  wait for is `max_batch`: Triton's plain dynamic batching. Requests are never split between
  batches: one bigger than `max_batch` (allowed up to `max_request`) runs alone, and the run
  function takes it in pieces; one bigger than `max_request` is refused (400).
- The queue holds at most `max_queue` requests; one more is refused at once (QueueFull -> 503
  with Retry-After): a bounded queue keeps memory and latency bounded under overload.
- `instances` batches run at the same time (one worker thread each, each with its own session):
  on a CPU, several smaller executions are the alternative to one big batch.
- A request that gives up (timeout, client gone) while queued is dropped before it is run; one
  that gives up while running is computed and its result discarded.
- `drain()` stops accepting, then waits (bounded) until everything accepted has been answered.
- A batch that raises fails each of its requests with that exception; its traceback is logged once,
  naming the batch's request ids (`submit`'s `tag`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np

from inceptionlab.host import name_os_thread
from inceptionlab.queueing import ArrivalRate, BatchRule

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """The queue holds max_queue requests: answer 503 with Retry-After."""


class Draining(Exception):
    """The server is shutting down and accepts nothing new."""


@dataclass
class _Entry:
    item: Any  # what the run function takes for this request (e.g. a float32 array)
    count: int  # items along axis 0
    future: asyncio.Future
    arrived: float
    tag: str = ""  # the request's id, for the log of a failed batch


@dataclass
class BatchStats:
    """What one execution did, for the metrics."""

    requests: int
    items: int
    queue_seconds: list[float]
    compute_seconds: float
    max_batch: int | None = None  # the plan's batch; None: the items ran as one execution

    def executions(self) -> list[int]:
        """Items of each execution: a plan of batch 1 answers a lone request of 3 images with 3 executions of 1."""
        if not self.max_batch:
            return [self.items]
        return [stop - start for start, stop in consecutive_batches(self.items, self.max_batch)]


# run(instance, items) -> one result per item (its slice of the batch output)
RunFn = Callable[[int, Sequence[Any]], Sequence[Any]]


class DynamicBatcher:
    def __init__(self, run: RunFn, max_batch: int, max_delay_s: float, max_queue: int, instances: int = 1,
                 on_batch: Callable[[BatchStats], None] = lambda stats: None, name: str = "model",
                 max_request: int | None = None, auto_limit: bool = False, rule: BatchRule | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.run, self.max_batch, self.max_delay, self.name = run, max_batch, max_delay_s, name
        # The plan's rule, with the delay this server runs at (--max-delay-ms may differ from the plan's).
        self.rule = replace(rule or BatchRule.full(max_batch, max_delay_s), max_batch=max_batch,
                            max_delay_s=max_delay_s)
        self.clock = clock
        self.rate = ArrivalRate()
        self.max_request = max(max_request or 0, max_batch)
        self.auto_limit = auto_limit  # max_request is --max-batch auto's, not a --max-batch the user set
        self.max_queue, self.instances, self.on_batch = max_queue, instances, on_batch
        self.queue: deque[_Entry] = deque()
        self.executing = 0  # requests inside a running batch
        self.peak_queue = 0  # the most requests ever waiting at once (bounded by max_queue)
        self.draining = False
        self._arrival = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._executor = ThreadPoolExecutor(max_workers=instances, thread_name_prefix=f"infer-{name}",
                                            initializer=name_os_thread)
        self._workers: list[asyncio.Task] = []

    @property
    def pending(self) -> int:
        return len(self.queue) + self.executing

    def start(self) -> None:
        self._workers = [asyncio.create_task(self._worker(i)) for i in range(self.instances)]

    async def stop(self) -> None:
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._executor.shutdown(wait=True)

    def check_accepting(self) -> None:
        """Raise QueueFull / Draining now: called before a request is parsed and decoded, so an
        overloaded server spends no CPU or memory on requests it would refuse anyway."""
        if self.draining:
            raise Draining("the server is shutting down")
        if len(self.queue) >= self.max_queue:
            raise QueueFull(f"{len(self.queue)} requests are queued (--max-queue {self.max_queue})")

    def check_size(self, count: int) -> None:
        """ValueError for a request bigger than max_request: a 400 whatever the load (retrying cannot help)."""
        if count > self.max_request:
            raise ValueError(f"a request of {count} items exceeds "
                             f"{request_limit(self.max_batch, self.max_request, self.auto_limit)}; "
                             "split it")

    async def submit(self, item: Any, count: int, timeout_s: float | None = None, tag: str = "") -> Any:
        """Queue one request and wait for its result; QueueFull / Draining refuse it at once."""
        self.check_size(count)
        self.check_accepting()
        entry = _Entry(item, count, asyncio.get_running_loop().create_future(), self.clock(), tag)
        self.rate.arrived(entry.arrived)
        self.queue.append(entry)
        self.peak_queue = max(self.peak_queue, len(self.queue))
        self._idle.clear()
        self._arrival.set()
        try:
            return await asyncio.wait_for(asyncio.shield(entry.future), timeout_s)
        finally:
            if not entry.future.done():
                entry.future.cancel()  # still queued: the worker skips it; running: result dropped

    def abandon(self) -> int:
        """A forced exit: every queued request is answered now as refused (the server is exiting), so
        its handler ends with a clean error instead of being cancelled as the event loop closes. The
        batches already running finish. Returns how many were refused."""
        self.draining = True
        refused = 0
        while self.queue:
            entry = self.queue.popleft()
            if not entry.future.done():  # done: its client gave up (timeout) already
                entry.future.set_exception(Draining("the server is exiting: this request was not run"))
                refused += 1
        self._note_idle()
        return refused

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new requests; True when every accepted one was answered within `timeout_s`."""
        self.draining = True
        return await self.wait_idle(timeout_s)

    async def wait_idle(self, timeout_s: float) -> bool:
        """True once nothing is queued or running (requests given up while queued are dropped first),
        False when that takes longer than `timeout_s`."""
        self._drop_abandoned()
        if not self.queue and self.executing == 0:
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    # ----------------------------------------------------------------------------- workers

    async def _worker(self, instance: int) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            if not batch:
                continue
            started = self.clock()
            try:
                results = await loop.run_in_executor(self._executor, self.run, instance, [e.item for e in batch])
                compute = self.clock() - started
                for entry, result in zip(batch, results):
                    if not entry.future.done():
                        entry.future.set_result(result)
            except Exception as exc:  # a failed batch fails its requests, never the worker
                compute = self.clock() - started
                log.error("model %s: a batch of %d request(s) failed (request ids: %s)", self.name, len(batch),
                          ", ".join(e.tag or "-" for e in batch), exc_info=exc)
                for entry in batch:
                    if not entry.future.done():
                        entry.future.set_exception(exc)
            finally:
                self.executing -= len(batch)
                self._note_idle()
            self.on_batch(BatchStats(len(batch), sum(e.count for e in batch),
                                     [started - e.arrived for e in batch], compute, self.max_batch))

    async def _next_batch(self) -> list[_Entry]:
        """Wait for a request, then, while the queue holds less than the rule's batch for the current
        rate, up to max_delay (from the oldest's arrival) for more."""
        while True:
            self._drop_abandoned()
            if self.queue:
                break
            self._arrival.clear()
            await self._arrival.wait()
        deadline = self.queue[0].arrived + self.rule.max_delay_s
        while self._queued_items() < self.rule.target(self.rate.rate) and not self.draining:
            remaining = deadline - self.clock()
            if remaining <= 0:
                break
            self._arrival.clear()
            try:
                await asyncio.wait_for(self._arrival.wait(), remaining)
            except asyncio.TimeoutError:
                break
        return self._take()

    def _queued_items(self) -> int:
        return sum(e.count for e in self.queue if not e.future.done())

    def _take(self) -> list[_Entry]:
        batch: list[_Entry] = []
        items = 0
        while self.queue:
            entry = self.queue[0]
            if entry.future.done():  # gave up while queued
                self.queue.popleft()
                continue
            if items + entry.count > self.max_batch and batch:  # a request over max_batch goes alone
                break
            batch.append(self.queue.popleft())
            items += entry.count
        self.executing += len(batch)  # counted before the queue looks empty: drain() waits for it
        if self.queue:
            self._arrival.set()  # leftovers: another worker (or the next round) takes them at once
        self._note_idle()
        return batch

    def _drop_abandoned(self) -> None:
        while self.queue and self.queue[0].future.done():
            self.queue.popleft()
        self._note_idle()

    def _note_idle(self) -> None:
        if not self.queue and self.executing == 0:
            self._idle.set()


def consecutive_batches(count: int, max_batch: int) -> list[tuple[int, int]]:
    """(start, stop) of each batch a request of `count` items runs as: one when it fits in `max_batch`, else
    consecutive full batches and the rest (serve.models.Engine.run runs them; the metrics count them)."""
    return [(start, min(start + max_batch, count)) for start in range(0, count, max_batch)] or [(0, 0)]


def request_limit(max_batch: int, max_request: int, auto: bool = False) -> str:
    """How the most items one request may hold is named in a refusal: the flag that set it. `auto`: the
    limit is --max-batch auto's (hardware.AUTO_MAX_BATCH), whatever batch the plan chose, even one equal to it."""
    if max_request == max_batch and not auto:
        return f"--max-batch {max_batch}"
    plan = f" (the plan batches {max_batch})" if max_batch != max_request else ""
    return f"{max_request}, the most one request holds with --max-batch auto{plan}"


def split_rows(output: np.ndarray, counts: Sequence[int]) -> list[np.ndarray]:
    """A batch output -> one slice per request, in order."""
    bounds = np.cumsum([0, *counts])
    return [output[bounds[i]:bounds[i + 1]] for i in range(len(counts))]
