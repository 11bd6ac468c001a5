"""Shared pieces of the serve tests: a tiny trained run, the served model, a uvicorn thread."""

from __future__ import annotations

import asyncio
import socket
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import uvicorn

from conftest import FAST, make_image_folder


_TINY: dict[str, tuple[Path, Path]] = {}


def train_tiny_run(tmp_path_factory) -> tuple[Path, Path]:
    """resnet18 at 75 px on coloured squares (3 classes), ~30 s on 2 cores, trained once per session:
    (run_dir, data)."""
    from inceptionlab.config import load_recipe
    from inceptionlab.engine.fit import fit

    if "run" not in _TINY:
        root = tmp_path_factory.mktemp("serve")
        data = make_image_folder(root / "data")
        recipe = load_recipe("inception_v3/imagefolder", [*FAST, f"data.root={data}", "train.epochs=2",
                                                          "model.name=resnet18"])
        _TINY["run"] = (fit(recipe, root / "runs", progress=False).run_dir, data)
    return _TINY["run"]


def train_tiny_text_run(tmp_path_factory) -> Path:
    """The IMDB recipe's text classifier on a miniature aclImdb (positive and negative words), one
    epoch, a few seconds: a text model to serve without the real data."""
    from inceptionlab.config import load_recipe
    from inceptionlab.engine.fit import fit

    if "text" not in _TINY:
        root = tmp_path_factory.mktemp("serve_text") / "aclImdb"
        words = {"pos": "great wonderful moving superb", "neg": "awful boring dull terrible"}
        for split in ("train", "test"):
            for label, text in words.items():
                (root / split / label).mkdir(parents=True)
                for i in range(10):
                    (root / split / label / f"{i}_{8 if label == 'pos' else 2}.txt").write_text(f"{text} film {i}")
        recipe = load_recipe("imdb/text_classifier", [f"data.root={root.parent}", "train.epochs=1", "data.download=false",
                                                      "train.log_every=1"])
        _TINY["text"] = (fit(recipe, root.parent / "runs", progress=False).run_dir, root)
    return _TINY["text"][0]


def serve_model(run_dir: Path, backend: str = "eager", max_batch: int = 8):
    from inceptionlab.serve.models import ModelLoadSettings, load_served_model

    settings = ModelLoadSettings(backend=backend, precision="fp32", device="cpu", max_batch=max_batch,
                             log=lambda message: None)
    return load_served_model(settings, run_dir=run_dir, name="tiny")


def quiet_uvicorn_config(app, **settings) -> uvicorn.Config:
    """uvicorn's settings for a server inside the pytest process: `log_config=None` keeps uvicorn from
    running `logging.config.dictConfig`, which closes every logging handler of the process; absl's (from
    tensorboard, OpenVINO's tools) then closes pytest's capture file whenever `capsys` has swapped
    `sys.stderr`, failing every later test of that worker (tests/test_in_process_servers.py)."""
    return uvicorn.Config(app, log_config=None, **settings)


class _SignallingServer(uvicorn.Server):
    """uvicorn that says when its lifespan has started and it serves (an event, not a polled flag), and
    in which event loop it runs."""

    def __init__(self, config: uvicorn.Config):
        super().__init__(config)
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)
        self.ready.set()


@contextmanager
def uvicorn_thread(app) -> Iterator[str]:
    """The app on 127.0.0.1 in a thread; yields its base URL once it serves and stops it after.

    The socket is bound and listening before the thread starts, so the port is known at once; the
    lifespan (batchers, the gRPC front end) has started when `ready` is set. The server's event loop
    is `app.state.event_loop`, for `in_server_loop`."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = _SignallingServer(quiet_uvicorn_config(app, log_level="warning", lifespan="on"))
    server.install_signal_handlers = lambda: None  # older uvicorn; newer ones skip non-main threads
    stopped = threading.Event()

    def run() -> None:
        try:
            server.run(sockets=[sock])
        finally:
            stopped.set()
            server.ready.set()  # wakes the wait below when start-up failed

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert server.ready.wait(timeout=60) and not stopped.is_set(), "uvicorn did not start within 60 s"
    app.state.event_loop = server.loop
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def in_server_loop(app, coroutine, timeout_s: float = 60):
    """Run `coroutine` in the event loop of the app's uvicorn_thread; its result."""
    return asyncio.run_coroutine_threadsafe(coroutine, app.state.event_loop).result(timeout_s)


def broken_model(run_dir: Path):
    """A served model whose network was damaged after loading (its last layer takes 7 features, not
    resnet18's 512): every batch fails inside PyTorch, as a bug in a model would."""
    import torch

    served = serve_model(run_dir)
    for engine in served.engines:
        for session in engine.sessions.values():
            session.fn.fc = torch.nn.Linear(7, 3)
    return served


def run_async(coro):
    return asyncio.run(coro)


def classify_over_both(base: str, grpc_port: int, image: bytes, http_calls: int, grpc_calls: int,
                       model: str = "tiny") -> None:
    """`http_calls` images to /v1/classify and `grpc_calls` to ModelInfer (BYTES [1, 1]), each answered."""
    import httpx
    import numpy as np
    import tritonclient.grpc as tg

    for _ in range(http_calls):
        assert httpx.post(f"{base}/v1/classify", content=image, timeout=60).status_code == 200
    with tg.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
        for _ in range(grpc_calls):
            tensor = tg.InferInput("image_bytes", [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[image]], dtype=object))
            client.infer(model, [tensor])
