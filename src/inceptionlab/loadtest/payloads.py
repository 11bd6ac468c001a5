"""Requests for an Open Inference Protocol server, built once before the load starts.

What one request carries is protocol-neutral (`TensorRequest`): encoded images as a BYTES tensor
(`payload="image"`: the server decodes and preprocesses), or pictures already resized to the input
shape that the model's metadata reports, as UINT8 pixels (`"tensor"`: our server normalises them) or
FP32 (`"fp32"`: what Triton serving the ONNX export takes). Each transport encodes it once: HTTP as
the binary tensor data extension (`infer_body`, by serve/protocol.py's codec: the header that carries
the JSON part's length, the BYTES element layout) or, with `body="json"`, as the protocol's plain JSON
form (`json_infer_body`: numbers as a list, BYTES as {"b64": ...}: what a server without the binary
extension reads), gRPC as a ModelInferRequest with `raw_input_contents` (grpc_client.py).
"""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from inceptionlab.data.io.image_files import expand_image_paths, sample_image_files
from inceptionlab.errors import UserError
from inceptionlab.serve.protocol import DTYPES, HEADER_LENGTH, encode_bytes_elements, tensor_from_raw

PAYLOADS = ("image", "tensor", "fp32")
# HTTP: the binary tensor data extension, or plain JSON (both the protocol's infer route); or the image
# file itself as the body (`raw`), or as a form's one file (`multipart`): what a web page or a phone
# sends to a classify route (ours: /v1/classify), no tensor protocol at all.
BODIES = ("binary", "json", "raw", "multipart")
FILE_BODIES = ("raw", "multipart")
MULTIPART_BOUNDARY = "inceptionlab-loadtest-boundary"
# Generated JPEGs when no images are given and the sample pictures are absent: 500x375 is the
# typical ImageNet validation picture (~110 KB decoded, ~20-40 KB as JPEG).
GENERATED_SIZE = (500, 375)
GENERATED_COUNT = 8


@dataclass(frozen=True)
class Prepared:
    """One ready request as it goes on the wire: over HTTP the JSON header + binary tensor data and
    its headers; over gRPC the serialized ModelInferRequest (no headers)."""

    body: bytes
    headers: dict[str, str]


@dataclass(frozen=True)
class TensorRequest:
    """One inference request of one input, whatever the protocol: its raw little-endian bytes (BYTES
    elements length-prefixed, as both protocols' binary forms carry them) and the output asked for."""

    input_name: str
    datatype: str
    shape: list[int]
    data: bytes
    output: str | None


def infer_body(input_name: str, datatype: str, shape: list[int], data: bytes,
               output: str | None = None) -> Prepared:
    """An infer request whose one input travels as binary data after the JSON header. Outputs are
    asked for in binary too: 1000 float logits as JSON text would cost the client ~10x more to read."""
    header: dict[str, Any] = {
        "inputs": [{"name": input_name, "shape": shape, "datatype": datatype,
                    "parameters": {"binary_data_size": len(data)}}],
        "parameters": {"binary_data_output": True},
    }
    if output:
        header["outputs"] = [{"name": output, "parameters": {"binary_data": True}}]
    text = json.dumps(header, separators=(",", ":")).encode()
    return Prepared(text + data, {HEADER_LENGTH: str(len(text)), "Content-Type": "application/octet-stream"})


def json_infer_body(tensor: TensorRequest) -> Prepared:
    """The same request in the protocol's plain JSON form: numbers as a flat list, BYTES elements as
    {"b64": ...} objects (KServe's form for binary data in JSON), the output asked for by name."""
    decoded = tensor_from_raw(tensor.input_name, tensor.datatype, tensor.shape, tensor.data).data
    data = [{"b64": base64.b64encode(item).decode()} for item in decoded] if tensor.datatype == "BYTES" \
        else decoded.reshape(-1).tolist()
    body: dict[str, Any] = {"inputs": [{"name": tensor.input_name, "shape": tensor.shape, "datatype": tensor.datatype,
                                        "data": data}]}
    if tensor.output:
        body["outputs"] = [{"name": tensor.output}]
    return Prepared(json.dumps(body, separators=(",", ":")).encode(), {"Content-Type": "application/json"})


def image_files(folders: list[Path]) -> list[Path]:
    """Image files of --images, else the sample pictures (the package's own, or INCEPTIONLAB_SAMPLE_IMAGES:
    the same ones `export` checks parity on), else []."""
    if folders:
        files, errors = expand_image_paths(list(folders))
        if errors:
            where, message = errors[0]
            raise UserError(f"--images {where}: {message}; pass a folder of JPEG/PNG files")
        return files
    return sample_image_files()


def generated_jpegs(count: int = GENERATED_COUNT, size: tuple[int, int] = GENERATED_SIZE,
                    seed: int = 0) -> list[bytes]:
    """Smooth random pictures saved as JPEG (quality 90): real decode work, no files needed."""
    rng = np.random.default_rng(seed)
    width, height = size
    pictures = []
    for _ in range(count):
        # Low-frequency colour fields, upsampled: compress like photos, unlike white noise.
        small = rng.integers(0, 256, size=(height // 25 + 1, width // 25 + 1, 3), dtype=np.uint8)
        image = Image.fromarray(small).resize((width, height), Image.BILINEAR)
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=90)
        pictures.append(buffer.getvalue())
    return pictures


def encoded_images(folders: list[Path]) -> list[bytes]:
    files = image_files(folders)
    if not files:
        return generated_jpegs()
    return [path.read_bytes() for path in files]


def tensor_pictures(encoded: list[bytes], channels: int, height: int, width: int, dtype: Any) -> list[np.ndarray]:
    """Pictures resized to the model's input (CHW), as the model's input datatype. UINT8 stays raw
    pixels (the server normalises); float inputs get pixel / 255 (values do not change the timing)."""
    arrays = []
    for data in encoded:
        image = Image.open(io.BytesIO(data)).convert("L" if channels == 1 else "RGB").resize((width, height))
        pixels = np.asarray(image, dtype=np.uint8).reshape(height, width, channels).transpose(2, 0, 1)
        if np.dtype(dtype).kind == "f":
            arrays.append(np.ascontiguousarray(pixels, dtype=dtype) / np.asarray(255, dtype=dtype))
        else:
            arrays.append(np.ascontiguousarray(pixels.astype(dtype)))
    return arrays


@dataclass
class ModelInfo:
    name: str
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]

    def input_for(self, payload: str) -> dict[str, Any]:
        """The input to send `payload` to. Encoded images go to a listed BYTES input, else to the one
        image input (ours lists FP32 [-1, C, H, W] and also takes BYTES [N] and UINT8 there); tensors
        go to the image input, whose shape fixes theirs."""
        images = [i for i in self.inputs if len(i.get("shape", [])) in (3, 4)]
        if payload == "image":
            listed = [i for i in self.inputs if i.get("datatype") == "BYTES"]
            if listed or len(images) == 1:
                return (listed or images)[0]
        elif images:
            return images[0]
        found = ", ".join(f"{i.get('name')} {i.get('datatype')} {i.get('shape')}" for i in self.inputs) or "none"
        raise UserError(f"model {self.name}: no input to send --payload {payload} to (inputs: {found})")


def tensor_requests(info: ModelInfo, payload: str, encoded: list[bytes]) -> list[TensorRequest]:
    """One request per picture (batch 1 each: batching is the server's job). image: the file's bytes
    as BYTES [1] ([1, 1] for an input declared [-1, 1], Triton's convention for an encoded image of a
    batching model); tensor: UINT8 [1, C, H, W] pixels (4x smaller than float; our server
    normalises); fp32: FP32 pixels / 255 (what Triton serving the ONNX export takes)."""
    spec = info.input_for(payload)
    output = info.outputs[0]["name"] if info.outputs else None
    shape = [int(d) for d in spec.get("shape", [])]
    if payload == "image":
        one = [1, 1] if spec.get("datatype") == "BYTES" and len(shape) == 2 else [1]
        return [TensorRequest(spec["name"], "BYTES", one, encode_bytes_elements([data]), output) for data in encoded]
    if any(d < 1 for d in shape[-3:]):
        raise UserError(f"model {info.name}: input {spec['name']} has shape {shape}; --payload {payload} needs "
                        "[-1, C, H, W] with fixed C, H, W")
    datatype = "UINT8" if payload == "tensor" else "FP32"
    channels, height, width = shape[-3:]
    request_shape = [1, channels, height, width] if len(shape) == 4 else [channels, height, width]
    return [TensorRequest(spec["name"], datatype, request_shape, array.tobytes(), output)
            for array in tensor_pictures(encoded, channels, height, width, DTYPES[datatype])]


def file_body(data: bytes, body: str) -> Prepared:
    """An encoded image as a request of its own: the file's bytes as the body (`raw`), or a form of one
    file field (`multipart`, built once here as a browser builds it)."""
    if body == "raw":
        return Prepared(data, {"Content-Type": "application/octet-stream"})
    head = (f'--{MULTIPART_BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="image"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    return Prepared(head + data + f"\r\n--{MULTIPART_BOUNDARY}--\r\n".encode(),
                    {"Content-Type": f"multipart/form-data; boundary={MULTIPART_BOUNDARY}"})


def prepare_requests(info: ModelInfo, payload: str, encoded: list[bytes], body: str = "binary") -> list[Prepared]:
    """The HTTP bodies of `tensor_requests`, in the binary extension's form or the plain JSON one; or each
    encoded image as a request of its own (`FILE_BODIES`, payload image only)."""
    if body in FILE_BODIES:
        if payload != "image":
            raise UserError(f"body {body} sends image files: use payload image, not {payload}")
        return [file_body(data, body) for data in encoded]
    tensors = tensor_requests(info, payload, encoded)
    if body == "json":
        return [json_infer_body(t) for t in tensors]
    return [infer_body(t.input_name, t.datatype, t.shape, t.data, t.output) for t in tensors]
