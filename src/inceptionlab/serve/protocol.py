"""The Open Inference Protocol (KServe v2) over HTTP: request parsing and response encoding.

JSON tensors carry their elements in `data` (row-major, flattened or nested). The binary tensor
data extension (Triton's, also KServe's) sends the JSON header first, its length in the
`Inference-Header-Content-Length` header, then each binary input's raw bytes in input order, each
input naming its byte count in `parameters.binary_data_size`. BYTES elements in binary form are a
4-byte little-endian length followed by the bytes. Responses use the same layout when the request
asks for binary outputs (`outputs[i].parameters.binary_data` or `parameters.binary_data_output`).

The gRPC form (serve/grpc_server.py) carries the same tensors either as typed repeated fields
(`contents.fp32_contents`, ...: CONTENTS_FIELDS) or as one raw little-endian byte string per input
(`raw_input_contents`, BYTES elements length-prefixed as above); both are decoded here, by the same
checks as the HTTP form, so a tensor means the same whichever way it came.

Every problem is a `ProtocolError` whose message becomes the one-line `{"error": "..."}` body (HTTP)
or the INVALID_ARGUMENT status message (gRPC).
"""

from __future__ import annotations

import base64
import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HEADER_LENGTH = "Inference-Header-Content-Length"

# OIP datatypes <-> numpy; BYTES is a Python list of bytes objects.
DTYPES: dict[str, Any] = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}
NUMPY_TO_DTYPE = {np.dtype(v): k for k, v in DTYPES.items()}
# The gRPC InferTensorContents field of each datatype (grpc_service.proto); FP16 travels raw only.
CONTENTS_FIELDS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


# Bounds on a client-given shape, checked in Python integers before numpy sees it (np.prod wraps around
# int64: [2**32, 2**32] multiplied to 0 and "matched" an empty tensor). 8 dimensions are more than any
# model here takes (NCHW is 4); 2**31 elements are 8 GiB of FP32, far above any --max-body-mb.
MAX_DIMS = 8
MAX_ELEMENTS = 2**31


class ProtocolError(ValueError):
    """A malformed request; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class InputTensor:
    name: str
    datatype: str
    shape: list[int]
    data: np.ndarray | list[bytes]

    @property
    def batch(self) -> int:
        return self.shape[0] if self.shape else 1


@dataclass
class InferRequest:
    inputs: list[InputTensor]
    id: str | None = None
    outputs: list[str] = field(default_factory=list)  # empty: every output
    binary_outputs: set[str] = field(default_factory=set)
    binary_all: bool = False
    parameters: dict[str, Any] = field(default_factory=dict)


def parse_infer_request(body: bytes, header_length: str | None) -> InferRequest:
    """The request body (JSON, or JSON header + binary tensors) -> tensors as numpy arrays."""
    if not body:
        raise ProtocolError("empty request body: send an inference request JSON ({\"inputs\": [...]})")
    json_part, binary = _split_body(body, header_length)
    try:
        header = json.loads(json_part)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"invalid JSON in the inference request ({exc})") from None
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list) or not header["inputs"]:
        raise ProtocolError('the inference request needs "inputs": a non-empty list of tensors')
    offset = 0
    inputs = []
    for raw in header["inputs"]:
        tensor, used = _parse_input(raw, binary, offset)
        inputs.append(tensor)
        offset += used
    if offset != len(binary):
        raise ProtocolError(f"{len(binary) - offset} bytes of binary data follow the tensors they belong to: "
                            "check binary_data_size and Inference-Header-Content-Length")
    return _request(header, inputs)


def _split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    if header_length is None:
        return body, b""
    try:
        length = int(header_length)
    except ValueError:
        raise ProtocolError(f"{HEADER_LENGTH}: {header_length!r} is not a byte count") from None
    if not 0 < length <= len(body):
        raise ProtocolError(f"{HEADER_LENGTH} {length} is outside the {len(body)}-byte body")
    return body[:length], body[length:]


def _request(header: dict[str, Any], inputs: list[InputTensor]) -> InferRequest:
    params = header.get("parameters") or {}
    outputs, binary = [], set()
    for out in header.get("outputs") or []:
        if not isinstance(out, dict) or not isinstance(out.get("name"), str):
            raise ProtocolError('each requested output needs a "name"')
        outputs.append(out["name"])
        if (out.get("parameters") or {}).get("binary_data"):
            binary.add(out["name"])
    return InferRequest(inputs, header.get("id"), outputs, binary, bool(params.get("binary_data_output")), params)


def _parse_input(raw: Any, binary: bytes, offset: int) -> tuple[InputTensor, int]:
    if not isinstance(raw, dict):
        raise ProtocolError("each input must be an object with name, shape, datatype and data")
    name, datatype, shape = raw.get("name"), raw.get("datatype"), raw.get("shape")
    if not isinstance(name, str):
        raise ProtocolError('an input has no "name"')
    check_header(name, datatype, shape)
    size = (raw.get("parameters") or {}).get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or size < 0 or offset + size > len(binary):
            raise ProtocolError(f"input {name!r}: binary_data_size {size} runs past the binary data "
                                f"({len(binary) - offset} bytes left)")
        return tensor_from_raw(name, datatype, shape, binary[offset:offset + size]), size
    if "data" in raw:
        data = _json_bytes(raw["data"], name) if datatype == "BYTES" else _json_array(raw["data"], datatype, name)
        return _tensor(name, datatype, shape, data), 0
    raise ProtocolError(f'input {name!r} has neither "data" nor parameters.binary_data_size')


def check_header(name: str, datatype: Any, shape: Any) -> None:
    """A tensor's datatype and shape, whichever form the request takes."""
    if datatype != "BYTES" and datatype not in DTYPES:
        raise ProtocolError(f"input {name!r}: datatype {datatype!r} is not an OIP datatype "
                            f"({', '.join([*DTYPES, 'BYTES'])})")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ProtocolError(f'input {name!r}: "shape" must be a list of non-negative integers')
    if len(shape) > MAX_DIMS:
        raise ProtocolError(f"input {name!r}: shape has {len(shape)} dimensions; at most {MAX_DIMS} are accepted")
    if max(shape, default=0) > MAX_ELEMENTS or math.prod(shape) > MAX_ELEMENTS:
        raise ProtocolError(f"input {name!r}: shape {shape} is larger than any tensor this server takes "
                            f"(at most {MAX_ELEMENTS:,} elements, and per dimension)")


def tensor_from_raw(name: str, datatype: str, shape: list[int], raw: bytes) -> InputTensor:
    """Raw little-endian bytes (HTTP's binary extension, gRPC's raw_input_contents) -> a tensor."""
    data = _bytes_elements(raw, name) if datatype == "BYTES" else _binary_array(raw, datatype, name)
    return _tensor(name, datatype, shape, data)


def tensor_from_values(name: str, datatype: str, shape: list[int], values: Any) -> InputTensor:
    """Typed values (gRPC's InferTensorContents field of the datatype) -> a tensor."""
    if datatype == "BYTES":
        return _tensor(name, datatype, shape, [bytes(v) for v in values])
    return _tensor(name, datatype, shape, _json_array(values, datatype, name))


def _tensor(name: str, datatype: str, shape: list[int], data: np.ndarray | list[bytes]) -> InputTensor:
    count = math.prod(shape)  # Python integers (check_header bounded them); 1 for a scalar
    got = len(data) if isinstance(data, list) else data.size
    if got != count:
        raise ProtocolError(f"input {name!r}: shape {shape} needs {count} elements, got {got}")
    if not isinstance(data, list):
        data = data.reshape(shape)
    return InputTensor(name, datatype, shape, data)


def _binary_array(chunk: bytes, datatype: str, name: str) -> np.ndarray:
    dtype = np.dtype(DTYPES[datatype]).newbyteorder("<")
    if len(chunk) % dtype.itemsize:
        raise ProtocolError(f"input {name!r}: {len(chunk)} bytes is not a whole number of {datatype} elements")
    return np.frombuffer(chunk, dtype=dtype)


def _json_array(data: Any, datatype: str, name: str) -> np.ndarray:
    try:
        array = np.asarray(data, dtype=DTYPES[datatype])
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(f"input {name!r}: data is not a {datatype} array ({exc})") from None
    return array.reshape(-1)


def _bytes_elements(chunk: bytes, name: str) -> list[bytes]:
    """Binary BYTES: each element is a uint32 little-endian length, then that many bytes."""
    items, pos = [], 0
    while pos < len(chunk):
        if pos + 4 > len(chunk):
            raise ProtocolError(f"input {name!r}: BYTES data ends inside an element's 4-byte length")
        (length,) = struct.unpack_from("<I", chunk, pos)
        if pos + 4 + length > len(chunk):
            raise ProtocolError(f"input {name!r}: a BYTES element of {length} bytes runs past the data")
        items.append(chunk[pos + 4:pos + 4 + length])
        pos += 4 + length
    return items


def _json_bytes(data: Any, name: str) -> list[bytes]:
    """JSON BYTES: strings; {"b64": "..."} objects carry binary data (an encoded image) in JSON."""
    flat = _flatten(data)
    items = []
    for item in flat:
        if isinstance(item, str):
            items.append(item.encode("utf-8"))
        elif isinstance(item, dict) and isinstance(item.get("b64"), str):
            try:
                items.append(base64.b64decode(item["b64"], validate=True))
            except ValueError:
                raise ProtocolError(f"input {name!r}: invalid base64 in a b64 element") from None
        else:
            raise ProtocolError(f'input {name!r}: BYTES elements are strings or {{"b64": "..."}} objects')
    return items


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    for item in data:
        out.extend(_flatten(item))
    return out


# --------------------------------------------------------------------------------------- responses


def encode_bytes_elements(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def raw_bytes(array: np.ndarray) -> bytes:
    """A numeric tensor as the protocol's raw form: row-major, little-endian."""
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


def config_data_type(datatype: str) -> str:
    """An OIP datatype -> Triton's model configuration DataType name (BYTES is TYPE_STRING there)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def encode_infer_response(model: str, version: str, request: InferRequest,
                          outputs: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """The response body and its extra headers: plain JSON, or JSON + binary outputs."""
    entries, blobs = [], []
    for name, array in outputs.items():
        array = np.ascontiguousarray(array)
        entry: dict[str, Any] = {"name": name, "datatype": NUMPY_TO_DTYPE[array.dtype], "shape": list(array.shape)}
        if request.binary_all or name in request.binary_outputs:
            blob = raw_bytes(array)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = array.reshape(-1).tolist()
        entries.append(entry)
    body: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": entries}
    if request.id is not None:
        body["id"] = request.id
    header = json.dumps(body, separators=(",", ":")).encode()
    if not blobs:
        return header, {"content-type": "application/json"}
    return header + b"".join(blobs), {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(header))}
