"""Shared pieces of the serve tests: a tiny trained run, the served model, a uvicorn thread."""

from __future__ import annotations

import asyncio
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


@contextmanager
def uvicorn_thread(app) -> Iterator[str]:
    """The app on 127.0.0.1, a free port, in a thread; yields its base URL and stops it after."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # older uvicorn; newer ones skip non-main threads
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    ready = threading.Event()
    for _ in range(600):  # bounded: 60 s
        if server.started:
            ready.set()
            break
        threading.Event().wait(0.1)
    assert ready.is_set(), "uvicorn did not start within 60 s"
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def run_async(coro):
    return asyncio.run(coro)
