"""Triton's gRPC service definition, verbatim, and the descriptor set compiled from it.

grpc_service.proto and model_config.proto are the files of github.com/triton-inference-server/common
at commit 83adf7cf88a2f343005974dff3728be746de2d66 (protobuf/), unchanged, under the BSD-3-Clause
licence in LICENSE beside them. They define `inference.GRPCInferenceService`, the Open Inference
Protocol's gRPC service (KServe's grpc_predict_v2.proto is its subset, with the same package and
service names) plus Triton's ModelConfig, ModelStatistics and RepositoryIndex, which Triton's clients
and perf_analyzer call. `inference.binpb` is what protoc makes of them (a FileDescriptorSet);
regenerate it with `make proto`, i.e. `python -m inceptionlab.serve.proto`, whose protoc is
grpcio-tools pinned in the `proto` extra.

`message(NAME)` is the class of `inference.NAME` from a private descriptor pool loaded from that set:
the server (serve/grpc_server.py) and the load generator's gRPC client (loadtest/grpc_client.py) use
the same definitions. A private pool, not generated *_pb2.py modules: those would register
`inference.*` in protobuf's process-wide default pool, where tritonclient.grpc registers its own copy
of the same messages, and a process importing both fails with "duplicate symbol
'inference.ServerLiveRequest'" (kserve/kserve#3099, SeldonIO/MLServer#1730). With a private pool a
server, our client and Triton's client live in one process (the tests; a model that calls Triton).

Only protobuf is needed here (no grpcio, no torch): the load generator may import this module.
"""

from __future__ import annotations

import functools
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PROTOS = ("grpc_service.proto", "model_config.proto")
DESCRIPTOR_SET = "inference.binpb"


def here() -> Path:
    return Path(str(resources.files(__name__)))


@functools.cache
def pool() -> descriptor_pool.DescriptorPool:
    """The messages and services of inference.binpb, in a pool of their own."""
    files = descriptor_pb2.FileDescriptorSet.FromString((here() / DESCRIPTOR_SET).read_bytes())
    private = descriptor_pool.DescriptorPool()
    for file in files.file:
        private.Add(file)
    return private


def message(name: str) -> Any:
    """The message class `inference.NAME` of the private pool."""
    return message_factory.GetMessageClass(pool().FindMessageTypeByName(f"inference.{name}"))


def descriptor_set_bytes() -> bytes:
    """What grpcio-tools' protoc makes of PROTOS: a FileDescriptorSet with imports, without source info."""
    from grpc_tools import protoc  # the `proto` extra: only regenerating needs it

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / DESCRIPTOR_SET
        args = ["protoc", f"-I{here()}", "--include_imports", f"--descriptor_set_out={out}", *PROTOS]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
        return out.read_bytes()
