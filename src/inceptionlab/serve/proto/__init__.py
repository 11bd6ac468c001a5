"""Triton's gRPC service definition, verbatim, and the descriptor set compiled from it.

grpc_service.proto and model_config.proto are the files of github.com/triton-inference-server/common
at commit 83adf7cf88a2f343005974dff3728be746de2d66 (protobuf/), unchanged, under the BSD-3-Clause
licence in LICENSE beside them. They define `inference.GRPCInferenceService`, the Open Inference
Protocol's gRPC service (KServe's grpc_predict_v2.proto is its subset, with the same package and
service names) plus Triton's ModelConfig, ModelStatistics and RepositoryIndex, which Triton's clients
and perf_analyzer call. `inference.binpb` is what protoc makes of them (a FileDescriptorSet);
regenerate it with `make proto`, i.e. `python -m inceptionlab.serve.proto`, whose protoc is
grpcio-tools pinned in the `proto` extra. serve/grpc_server.py says why a descriptor set and not
*_pb2.py modules.
"""

from __future__ import annotations

import tempfile
from importlib import resources
from pathlib import Path

PROTOS = ("grpc_service.proto", "model_config.proto")
DESCRIPTOR_SET = "inference.binpb"


def here() -> Path:
    return Path(str(resources.files(__name__)))


def descriptor_set_bytes() -> bytes:
    """What grpcio-tools' protoc makes of PROTOS: a FileDescriptorSet with imports, without source info."""
    from grpc_tools import protoc  # the `proto` extra: only regenerating needs it

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / DESCRIPTOR_SET
        args = ["protoc", f"-I{here()}", "--include_imports", f"--descriptor_set_out={out}", *PROTOS]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
        return out.read_bytes()
