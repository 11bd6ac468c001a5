"""POST /v1/explain: a Grad-CAM overlay (PNG) of one image, when the server was started with --explain.

    curl -s --data-binary @dog.jpg 'http://127.0.0.1:8000/v1/explain?model=NAME' -o dog.cam.png

Off by default: an explanation runs the eager PyTorch model forward and backward (judge/explain.py),
whatever runtime serves /infer, so it costs several inferences (benchmarks/explain.py measures how many)
and is kept out of the batcher and the inference metrics. Explanations run one at a time per model in
the preprocessing threads, so they never hold up the event loop or the batches. The model answers by the
served model's decision rule (its test-time augmentation, temperature and threshold, as /v1/classify): the
headers name the class explained (the rule's class unless `target=INDEX` is given), its calibrated
probability, and the rule's answer for the image (its label, or "unknown").
"""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import Response

from inceptionlab.errors import UserError
from inceptionlab.judge.explain import Explainer, overlay
from inceptionlab.serve.protocol import ProtocolError
from inceptionlab.serve.service import ServeError, ServeState

OFF_MESSAGE = ("explanations are off: start the server with --explain (each one runs the model forward and "
               "backward: several inferences' worth of compute)")


@dataclass
class ExplainService:
    """One Explainer per served image model, each used by one request at a time."""

    explainers: dict[str, Explainer]
    locks: dict[str, threading.Lock] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.locks = {name: threading.Lock() for name in self.explainers}

    def explain(self, name: str, pixels: Any, target: int | None) -> Explained:
        """uint8 CHW image -> its overlay for the rule's class (or `target`), with the rule's answer."""
        explainer = self.explainers[name]
        batch = torch.as_tensor(pixels)[None]
        with self.locks[name]:
            answers = explainer.answers(batch)
            index = int(answers.index[0]) if target is None else target
            cam = explainer.maps(batch, [index])[0]
        buffer = io.BytesIO()
        overlay(batch[0], cam).save(buffer, format="PNG")
        row = answers.row(0, explainer.spec.labels)
        return Explained(buffer.getvalue(), index, float(answers.probabilities[0, index]), row["answer"],
                         row.get("reason"), row.get("knn_distance"))


@dataclass(frozen=True)
class Explained:
    png: bytes  # the overlay
    index: int  # the class explained
    probability: float  # its calibrated probability under the rule
    answer: str  # the rule's answer for the image: its label, or "unknown"
    reason: str | None = None  # under a rule with a kNN bank: why it is unknown (far, unsure), None if answered
    knn_distance: float | None = None  # under a rule with a kNN bank: the image's distance


def install_explain_route(app: FastAPI, state: ServeState, service: ExplainService | None) -> None:
    @app.post("/v1/explain")
    async def explain(request: Request, model: str | None = None, target: int | None = None) -> Response:
        if service is None:
            raise ServeError("not_found", OFF_MESSAGE)
        served = state.model(model or next(iter(state.models)))
        if served.name not in service.explainers:
            raise ServeError("invalid", f"model {served.name!r} takes {served.spec.input_kind}: Grad-CAM explains images")
        if target is not None and not 0 <= target < served.spec.num_classes:
            raise ServeError("invalid", f"target={target}: the model has classes 0-{served.spec.num_classes - 1}")
        data = await request.body()
        try:
            pixels = await state.in_thread(served.preprocess_image, data, "body")
        except (ProtocolError, UserError) as exc:
            raise ServeError("invalid", str(exc)) from None
        done = await state.in_thread(service.explain, served.name, pixels, target)
        headers = {"X-Class-Index": str(done.index), "X-Class-Label": _header(served.spec.labels[done.index]),
                   "X-Class-Probability": f"{done.probability:.6f}", "X-Answer": _header(done.answer)}
        if done.knn_distance is not None:  # a rule with a kNN bank: why, and how far
            headers.update({"X-Unknown-Reason": done.reason or "", "X-Knn-Distance": f"{done.knn_distance:.6f}"})
        return Response(done.png, media_type="image/png", headers=headers)


def _header(text: str) -> str:
    """A label as an HTTP header value (ASCII; other characters become '?')."""
    return text.encode("ascii", "replace").decode()
