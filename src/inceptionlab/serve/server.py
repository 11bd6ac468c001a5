"""Running the app under uvicorn with a graceful SIGTERM: drain first, then exit 0.

uvicorn's own SIGTERM handling closes the listening socket at once and, after its shutdown,
re-raises the signal (the process then dies by SIGTERM, exit status 143). Here the first SIGTERM
or SIGINT turns readiness to 503 (gRPC: NOT_SERVING) and refuses new requests (503 with a JSON body;
gRPC: UNAVAILABLE) while queued and running ones are answered (at most `drain_s`), then uvicorn and
the gRPC server shut down and the process exits 0. A second signal during the drain exits at once:
the requests still queued are refused (503; gRPC: UNAVAILABLE) and counted on stdout, the running
batches finish. One after the drain is done changes nothing (the shutdown under way is already quick:
an impatient Ctrl-C twice on an idle server lands there).

Keep-alive connections: while draining, every answer says `Connection: close` (app.CloseWhileDraining),
so each connection a client uses during the drain is closed after its answer, and the client's next
request opens a new one and gets a 503 with a JSON body. Idle connections are left open until the
exit, not closed when the drain begins: a client may be sending on one at that moment, and a request
on a connection the server closes gets no answer at all, which perf_analyzer reports as "failed to
parse the request JSON buffer: The document is empty" (its HTTP client parses the empty body of a
failed transfer). After the exit, a client that goes on sending meets a closed port, whatever the server did.
"""

from __future__ import annotations

import asyncio
import gc
from types import FrameType
from typing import Callable

import uvicorn
from fastapi import FastAPI

from inceptionlab.serve.app import bind_grpc_port

# uvicorn's own bound: open connections plus running requests. Past it uvicorn answers a plain 503
# itself; the app's ConcurrencyLimit refuses earlier, with a JSON body, at --max-concurrency requests in
# progress: this one bounds the connections idle clients may hold open on top of those.
CONNECTIONS_PER_REQUEST = 2


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI, drain_s: float,
                 on_ready: Callable[[int, int | None], None] | None = None):
        super().__init__(config)
        self.app, self.drain_s, self.on_ready = app, drain_s, on_ready
        self.loop: asyncio.AbstractEventLoop | None = None
        self.drain_task: asyncio.Task | None = None
        self.signals = 0

    async def startup(self, sockets: list | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        # gRPC's port is bound before uvicorn runs the app's start-up, which would print a port taken since
        # the command's check as a traceback and "Application startup failed": a UserError here ends the
        # command with its one line.
        await bind_grpc_port(self.app)
        await super().startup(sockets)
        settle_collector()
        if self.on_ready is not None and self.started:
            # Both front ends listen now (the lifespan, which starts gRPC, ran first): their real ports.
            self.on_ready(self.http_port(), self.app.state.serve.grpc_port)

    def http_port(self) -> int:
        return int(self.servers[0].sockets[0].getsockname()[1])

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.signals += 1
        if self.loop is None:  # not started: go now
            self.should_exit = True
        elif self.signals == 1:
            # Python runs signal handlers in the main thread, the event loop's, before its next bytecode: the
            # flags flip before any request read after the signal is answered (on uvloop the drain task would
            # start only after the requests of the loop's current turn, which would still be accepted).
            self.app.state.serve.stop_accepting()
            self.loop.call_soon_threadsafe(self._start_drain)
        elif not (self.drain_task is not None and self.drain_task.done()):  # drained: nothing left to force
            self.loop.call_soon_threadsafe(self._exit_now)

    def _start_drain(self) -> None:
        self.drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        state = self.app.state.serve
        print(f"draining: readiness 503, answering accepted requests (at most {self.drain_s:g} s)", flush=True)
        complete = await state.drain(self.drain_s)
        print("drained" if complete else "drain time over: exiting with requests unanswered", flush=True)
        self.should_exit = True

    def _exit_now(self) -> None:
        """The second signal during the drain: stop waiting for the accepted requests."""
        if self.force_exit:
            return
        state = self.app.state.serve
        if self.drain_task is not None:
            self.drain_task.cancel()
        accepted = state.pending()
        queued = state.abandon()
        print(f"second signal: exiting now: {queued} queued request(s) refused (503), the {accepted - queued} "
              "running finish", flush=True)
        self.should_exit = self.force_exit = True

    async def shutdown(self, sockets: list | None = None) -> None:
        await super().shutdown(sockets)
        if self.force_exit:
            # uvicorn skips the app's shutdown on a forced exit, and the lifespan it leaves waiting is
            # cancelled as the loop closes, which it logs as an error with a traceback. Run it instead:
            # abandoned, the app stops its batchers and gRPC without draining.
            await self.lifespan.shutdown()


def settle_collector() -> None:
    """Move everything start-up allocated (models, libraries: ~430,000 tracked objects for the demo
    model) out of the garbage collector's reach, once the server is ready.

    A full (generation-2) collection walks every tracked object: one over the loaded models took 209 ms
    in the first loaded window of a server on a 2-core AMD EPYC, a p99 of 215-313 ms in one window in
    three at 100 requests/s against 32-41 ms in the others. Frozen objects are never walked again. The
    collection first frees start-up's garbage, and sets the collector's reference for the next full
    collection to start-up's object count: it comes only once the objects kept since then reach a
    quarter of that (CPython's rule up to 3.13; tests/test_serve_gc.py checks the behaviour on the
    running version), which a steady server does not do. Freed tensors and request objects are
    reference-counted as before; cycles among them are still collected by the young generations.
    gunicorn users (before forking) and Instagram do the same.

    The young generations keep CPython's thresholds (700, 10, 10). Counted with a gc.callbacks probe in
    a server under Poisson load (Fashion-MNIST MLP, tensors, 40 requests/s, 3 rounds alternating with a
    twin server; a shared 2-core AMD EPYC): after the freeze, one young collection per ~23 requests and
    no full one, ~57 us of collection per request against ~3.6 ms of CPU per request; collecting the
    youngest every 10,000 allocations instead cut that to ~20 us (1% of the CPU) but keeps cyclic
    garbage, such as an exception's frames holding a 20 MB request body, 14x longer.
    benchmarks/serve_cpu.py's `young10k` variant measures it again.
    """
    gc.collect()
    gc.freeze()


def uvicorn_config(app: FastAPI, host: str, port: int, drain_s: float, log_level: str = "warning") -> uvicorn.Config:
    """uvicorn's settings for the app: its connection bound follows --max-concurrency."""
    limit = app.state.serve.settings.max_concurrency * CONNECTIONS_PER_REQUEST
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False, limit_concurrency=limit,
                          timeout_graceful_shutdown=max(1, int(drain_s)), lifespan="on")


def serve_forever(app: FastAPI, host: str, port: int, drain_s: float, log_level: str = "warning",
                  on_ready: Callable[[int, int | None], None] | None = None) -> None:
    """Serve until SIGTERM; `on_ready(http_port, grpc_port)` once both listen (port 0: the one bound)."""
    server = DrainingServer(uvicorn_config(app, host, port, drain_s, log_level), app, drain_s, on_ready)
    server.run()


