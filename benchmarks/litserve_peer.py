"""The peer server of benchmarks/serve.py: LitServe + ONNX Runtime on an inceptionlab ONNX export, the server a
user would assemble from those two libraries, answering the Open Inference Protocol's plain JSON form so
that the same load generator drives it.

    python benchmarks/litserve_peer.py --onnx RUN/exports/model.onnx --name demo --port 8100

It serves `POST /v2/models/NAME/infer` (one encoded image per request as BYTES {"b64": ...}, the way the
load generator's `body="json"` sends it, or as the one file of a multipart form, `body="multipart"`: LitServe
parses forms itself and hands the worker the form; it reads no raw image bodies, since it parses every other
body as JSON), `GET /v2/models/NAME` (the metadata the load generator reads), and LitServe's own `/health`. Each request is decoded and preprocessed as the export's sidecar
(model.onnx.json) says (resize the shorter side with its interpolation, centre crop, scale, normalise:
PIL and numpy, what a LitServe user writes), batched by LitServe (--max-batch, --batch-timeout; its
default is no batching), run by ONNX Runtime on the CPU with --threads intra-op threads, and answered
with softmax probabilities as FP32 JSON. Nothing of inceptionlab is imported: the peer is what one
would write without it.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
from pathlib import Path
from typing import Any

import litserve as ls
import numpy as np
import onnxruntime as ort
from PIL import Image

INTERPOLATIONS = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}


class OnnxClassifier(ls.LitAPI):
    def __init__(self, onnx: Path, preprocessing: dict[str, Any], threads: int, **kwargs: Any):
        super().__init__(**kwargs)
        self.onnx, self.prep, self.threads = onnx, preprocessing, threads

    def setup(self, device: str) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(self.onnx), options, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name
        prep = self.prep
        self.mean = np.asarray(prep["mean"], np.float32).reshape(-1, 1, 1)
        self.std = np.asarray(prep["std"], np.float32).reshape(-1, 1, 1)
        self.mode = "L" if prep["channels"] == 1 else "RGB"
        self.resample = INTERPOLATIONS[prep["interpolation"]]

    # LitServe reads these two signatures: no annotation on `request` means "the parsed JSON body", and
    # none on the return value means "JSON". (Annotations here would become FastAPI parameters.)
    def decode_request(self, request):  # noqa: ANN001, ANN201
        if hasattr(request, "multi_items"):  # a multipart form (LitServe parses it): its one file
            data = next(value for _, value in request.multi_items() if hasattr(value, "read")).file.read()
        else:
            item = request["inputs"][0]["data"]
            while isinstance(item, list):
                item = item[0]
            data = base64.b64decode(item["b64"])
        return self.preprocess(Image.open(io.BytesIO(data)).convert(self.mode))

    def preprocess(self, image: Image.Image) -> np.ndarray:
        resize, crop = self.prep["resize_shorter_side"], self.prep["center_crop"]
        width, height = image.size  # the shorter side to `resize`, the longer one in proportion, rounded down
        size = (resize, int(resize * height / width)) if width <= height else (int(resize * width / height), resize)
        image = image.resize(size, self.resample)
        left, top = (image.width - crop) // 2, (image.height - crop) // 2
        pixels = np.asarray(image.crop((left, top, left + crop, top + crop)), np.float32) / 255.0
        pixels = pixels.reshape(crop, crop, -1).transpose(2, 0, 1)
        return (pixels - self.mean) / self.std

    def batch(self, inputs: list[np.ndarray]) -> np.ndarray:
        return np.stack(inputs)

    def predict(self, batch: np.ndarray) -> np.ndarray:
        if batch.ndim == 3:  # unbatched: LitServe hands over one request's input
            batch = batch[None]
        logits = self.session.run(None, {self.input_name: np.ascontiguousarray(batch, np.float32)})[0]
        exp = np.exp(logits - logits.max(axis=1, keepdims=True))
        return exp / exp.sum(axis=1, keepdims=True)

    def unbatch(self, output: np.ndarray) -> list[np.ndarray]:
        return list(output)

    def encode_response(self, probabilities):  # noqa: ANN001, ANN201
        row = np.asarray(probabilities, np.float32).reshape(1, -1)
        return {"outputs": [{"name": "probabilities", "datatype": "FP32", "shape": list(row.shape),
                             "data": row[0].tolist()}]}


def metadata(name: str, sidecar: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "platform": "litserve_onnxruntime",
            "inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [-1, 1]}],
            "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, sidecar["output"]["shape"][-1]]}]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnx", type=Path, required=True)
    parser.add_argument("--name", default="model")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--max-batch", type=int, default=1)
    parser.add_argument("--batch-timeout", type=float, default=0.0, help="seconds")
    parser.add_argument("--workers", type=int, default=1, help="inference worker processes")
    args = parser.parse_args()
    sidecar = json.loads(args.onnx.with_name(args.onnx.name + ".json").read_text())  # export's model.onnx.json
    api = OnnxClassifier(args.onnx, sidecar["preprocessing"], args.threads, max_batch_size=args.max_batch,
                         batch_timeout=args.batch_timeout, api_path=f"/v2/models/{args.name}/infer")
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=args.workers)
    server.app.add_api_route(f"/v2/models/{args.name}", lambda: metadata(args.name, sidecar), methods=["GET"])
    server.run(port=args.port, host="127.0.0.1", generate_client_file=False, log_level="warning")


if __name__ == "__main__":
    main()
