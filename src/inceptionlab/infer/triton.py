"""Triton model repository and KServe InferenceService from a checked ONNX export.

    write_triton_repository(onnx_file, spec, RUN_DIR/exports/triton, TritonOptions(max_batch=32))

    exports/triton/<name>/config.pbtxt    backend onnxruntime, dynamic batching, instance group,
                                          inputs/outputs read from the ONNX graph, warm-up
    exports/triton/<name>/1/model.onnx    the export (parity-checked against PyTorch)
    exports/triton/<name>/labels.txt      class labels, one per line in index order
    exports/kserve.yaml                   an InferenceService running that repository on Triton

Triton (NVIDIA's build; AMD's ROCm build with ONNX Runtime's MIGraphX provider; or CPU with the
OpenVINO accelerator) then speaks the same Open Inference Protocol as `inceptionlab serve`, so
`inceptionlab loadtest` and any KServe v2 client work against both. The batching settings mean the
same in both: `max_batch` = Triton's max_batch_size, `max_delay_ms` = max_queue_delay_microseconds,
`max_queue` = the default queue policy's max_queue_size (beyond it: rejected, like our 503),
`instances` = instance_group count.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from inceptionlab.errors import UserError
from inceptionlab.fileio import atomic_write_text, plain_mode
from inceptionlab.infer.batching import batch_buckets
from inceptionlab.infer.opsets import runtime_note
from inceptionlab.models.spec import ModelSpec

# The ONNX Runtime backend's accelerator names (its README; "migraphx" is what AMD's ROCm build
# tests with) and whether they run on a GPU instance.
ACCELERATORS = {"none": "cpu", "openvino": "cpu", "cuda": "gpu", "tensorrt": "gpu", "migraphx": "gpu"}
# ONNX TensorProto element types -> Triton's DataType names.
ONNX_TO_TRITON = {1: "TYPE_FP32", 2: "TYPE_UINT8", 3: "TYPE_INT8", 4: "TYPE_UINT16", 5: "TYPE_INT16",
                  6: "TYPE_INT32", 7: "TYPE_INT64", 9: "TYPE_BOOL", 10: "TYPE_FP16", 11: "TYPE_FP64",
                  12: "TYPE_UINT32", 13: "TYPE_UINT64", 16: "TYPE_BF16"}
MARKER = "# Written by `inceptionlab export --format triton`"
KSERVE_FILE = "kserve.yaml"
DEFAULT_STORAGE_URI = "pvc://inceptionlab-models/triton"  # a placeholder: where you upload exports/triton/


@dataclass
class TritonOptions:
    name: str | None = None  # model name in the repository and in URLs; default: default_model_name
    max_batch: int = 32
    max_delay_ms: float = 2.0  # longest a request waits for its batch to fill
    max_queue: int = 256  # queued requests beyond this are rejected
    instances: int = 1  # model instances (CPU: concurrent sessions; GPU: per device)
    accelerator: str = "none"  # none | openvino | cuda | tensorrt | migraphx
    storage_uri: str = DEFAULT_STORAGE_URI

    def check(self) -> None:
        if self.accelerator not in ACCELERATORS:
            raise UserError(f"--accelerator {self.accelerator}: use one of {', '.join(ACCELERATORS)}")
        if self.max_batch < 1 or self.instances < 1 or self.max_queue < 1 or self.max_delay_ms < 0:
            raise UserError("--max-batch, --instances and --max-queue must be >= 1 and --max-delay-ms >= 0")

    @property
    def kind(self) -> str:
        return ACCELERATORS[self.accelerator]


@dataclass
class Tensor:
    name: str
    data_type: str
    dims: list[int]  # without the batch axis


@dataclass
class TritonRepository:
    root: Path
    model_dir: Path
    config: Path
    onnx: Path
    labels: Path
    kserve: Path
    name: str
    removed: list[str] = field(default_factory=list)  # earlier exports of ours taken out of the repository
    note: str = ""  # which ONNX Runtime and Triton the export's opset needs

    def to_dict(self) -> dict[str, Any]:
        return {key: value if isinstance(value, list) else str(value) for key, value in self.__dict__.items()}


def model_name(text: str) -> str:
    """Triton takes any directory name, but URLs and KServe want [a-z0-9_-]: inception_v3 stays."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._-")
    if not name:
        raise UserError(f"--name {text!r}: give a model name of letters, digits, '_' or '-'")
    return name


def default_model_name(arch: str, run_dir: Path | None) -> str:
    """A run's export is `<arch>_<run folder>` (resnet18_20261122-101500): two runs' models can share one
    Triton repository. A pretrained model's is its architecture."""
    return model_name(f"{arch}_{Path(run_dir).name}" if run_dir is not None else arch)


def kserve_name(name: str) -> str:
    """An InferenceService name Kubernetes accepts (DNS-1035: lower-case letters, digits and '-', a letter
    first, a letter or digit last, at most 63 characters): '9digits' -> 'm-9digits'."""
    text = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]+", "-", name.lower())).strip("-")
    if not text[:1].isalpha():
        text = f"m-{text}"
    return text[:63].rstrip("-")


def graph_tensors(onnx_file: Path) -> tuple[list[Tensor], list[Tensor]]:
    """Inputs and outputs of the exported graph, batch axis removed (it must be dynamic)."""
    import onnx  # optional extra (onnx): imported on use, not at start-up

    graph = onnx.load(str(onnx_file), load_external_data=False).graph
    initializers = {init.name for init in graph.initializer}

    def tensor(info: Any) -> Tensor:
        dims = info.type.tensor_type.shape.dim
        if not dims or dims[0].HasField("dim_value"):
            raise UserError(f"{onnx_file}: {info.name} has a fixed batch axis; Triton's dynamic batching needs "
                            "a dynamic one: export without --static-batch")
        rest = [d.dim_value if d.HasField("dim_value") else -1 for d in dims[1:]]
        data_type = ONNX_TO_TRITON.get(info.type.tensor_type.elem_type)
        if data_type is None:
            raise UserError(f"{onnx_file}: {info.name} has ONNX element type {info.type.tensor_type.elem_type}, "
                            "which Triton has no type for")
        return Tensor(info.name, data_type, rest)

    inputs = [tensor(i) for i in graph.input if i.name not in initializers]
    return inputs, [tensor(o) for o in graph.output]


def _dims(dims: list[int]) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + " ]"


def config_text(name: str, inputs: list[Tensor], outputs: list[Tensor], options: TritonOptions,
                labels_file: str | None, parameters: list[tuple[str, str]] | None = None, note: str = "") -> str:
    """config.pbtxt (protobuf text format of Triton's ModelConfig)."""
    lines = [MARKER, *([f"# {note}"] if note else []), f'name: "{name}"', 'backend: "onnxruntime"',
             f"max_batch_size: {options.max_batch}", ""]
    if parameters:
        # The decision rule for clients (the graph answers raw logits): probabilities = softmax(logits /
        # temperature); "unknown" where the top probability is below reject_threshold. Read with the config.
        lines += ["# Calibrated probabilities: softmax(logits / temperature) in float64; answer \"unknown\" where the",
                  "# top one is below reject_threshold (a score equal to it is answered).",
                  "# tta: the views the rule was fitted on (their logits averaged); this graph runs one view per call."]
        lines += [f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}' for key, value in parameters]
        lines += [""]
    for spec in inputs:
        image = len(spec.dims) == 3
        lines += ["input [", "  {", f'    name: "{spec.name}"', f"    data_type: {spec.data_type}"]
        lines += ["    format: FORMAT_NCHW"] if image else []
        lines += [f"    dims: {_dims(spec.dims)}", "  }", "]"]
    for index, spec in enumerate(outputs):
        lines += ["output [", "  {", f'    name: "{spec.name}"', f"    data_type: {spec.data_type}",
                  f"    dims: {_dims(spec.dims)}"]
        # The classification extension (`class_count` in a request) reads labels from this file.
        lines += [f'    label_filename: "{labels_file}"'] if labels_file and index == 0 else []
        lines += ["  }", "]"]
    lines += ["", "dynamic_batching {", f"  max_queue_delay_microseconds: {round(options.max_delay_ms * 1000)}",
              "  default_queue_policy {", f"    max_queue_size: {options.max_queue}", "  }", "}", "",
              "instance_group [", "  {", f"    count: {options.instances}",
              f"    kind: {'KIND_GPU' if options.kind == 'gpu' else 'KIND_CPU'}", "  }", "]"]
    if options.accelerator != "none":
        which = "gpu_execution_accelerator" if options.kind == "gpu" else "cpu_execution_accelerator"
        lines += ["", "optimization {", "  execution_accelerators {", f'    {which}: [ {{ name: "{options.accelerator}" }} ]',
                  "  }", "}"]
    lines += _warmup(inputs, options.max_batch)
    return "\n".join(lines) + "\n"


def _warmup(inputs: list[Tensor], max_batch: int) -> list[str]:
    """Warm every power-of-two batch size up to max_batch before the model is ready, as our server does:
    the first call at a new size allocates and picks kernels (~10x a normal call)."""
    sizes = batch_buckets(max_batch)
    lines = ["", "model_warmup ["]
    for index, batch in enumerate(sizes):
        lines += ["  {", f'    name: "batch_{batch}"', f"    batch_size: {batch}"]
        for spec in inputs:
            dims = [d if d > 0 else 1 for d in spec.dims]
            lines += ["    inputs {", f'      key: "{spec.name}"', "      value {", f"        data_type: {spec.data_type}",
                      f"        dims: {_dims(dims)}", "        zero_data: true", "      }", "    }"]
        lines += ["  }" + ("," if index < len(sizes) - 1 else "")]
    return lines + ["]"]


def kserve_manifest(name: str, options: TritonOptions) -> str:
    """An InferenceService (serving.kserve.io/v1beta1) running the repository on Triton."""
    resources: dict[str, Any] = {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}}
    model: dict[str, Any] = {"modelFormat": {"name": "triton"}, "protocolVersion": "v2",
                             "storageUri": options.storage_uri, "resources": resources}
    if options.accelerator == "migraphx":
        # KServe ships NVIDIA's Triton as kserve-tritonserver; AMD GPUs need a ServingRuntime with
        # AMD's ROCm build of Triton (named here tritonserver-rocm) and the AMD device plugin.
        model["runtime"] = "tritonserver-rocm"
        resources["limits"]["amd.com/gpu"] = "1"
    else:
        model["runtime"] = "kserve-tritonserver"
        if options.kind == "gpu":
            resources["limits"]["nvidia.com/gpu"] = "1"
    service = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
               "metadata": {"name": kserve_name(name)},
               "spec": {"predictor": {"model": model}}}
    header = (f"{MARKER}\n# Upload the model repository (exports/triton/) where the cluster can read it, set\n"
              "# storageUri to it, then `kubectl apply -f kserve.yaml`. Requests: POST\n"
              f"# /v2/models/{name}/infer (Open Inference Protocol), e.g. `inceptionlab loadtest URL --model {name} "
              "--payload fp32`.\n")
    return header + yaml.safe_dump(service, sort_keys=False)


def write_triton_repository(onnx_file: Path, spec: ModelSpec, root: Path, options: TritonOptions,
                            opset: int | None = None) -> TritonRepository:
    """Write root/<name>/{config.pbtxt, labels.txt, 1/model.onnx} and root/../kserve.yaml. The model
    folder is built beside the target and renamed into place; a folder there that this command did not
    write is never replaced. Our earlier exports under other names are taken out of `root` (the
    repository of one run or one --model, which Triton would load them from too)."""
    options.check()
    name = model_name(options.name or spec.arch)
    note = runtime_note(opset) if opset is not None else ""
    inputs, outputs = graph_tensors(Path(onnx_file))
    if outputs and outputs[0].dims != [spec.num_classes]:
        raise UserError(f"{onnx_file}: output {outputs[0].name} has dims {outputs[0].dims} but the model has "
                        f"{spec.num_classes} classes: it is another model's export; re-run `inceptionlab export`")
    root = Path(root)
    target = root / name
    _check_replaceable(target)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    try:
        os.chmod(staging, plain_mode(directory=True))  # mkdtemp's 0700: Triton may run as another user
        (staging / "1").mkdir()
        shutil.copyfile(onnx_file, staging / "1" / "model.onnx")  # copyfile: a new file, the umask's mode
        (staging / "labels.txt").write_text("\n".join(spec.labels) + "\n")
        (staging / "config.pbtxt").write_text(config_text(name, inputs, outputs, options, "labels.txt",
                                                          spec.rule.parameters(), note))
        _swap_into_place(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    removed = _remove_earlier_exports(root, keep=name)

    kserve = root.parent / KSERVE_FILE
    _check_replaceable_file(kserve)
    atomic_write_text(kserve, kserve_manifest(name, options))
    return TritonRepository(root, target, target / "config.pbtxt", target / "1" / "model.onnx",
                            target / "labels.txt", kserve, name, removed, note)


def _remove_earlier_exports(root: Path, keep: str) -> list[str]:
    """Model folders of ours other than `keep` (an export under an earlier name): Triton would load them
    beside the new one. Folders we did not write stay."""
    removed = []
    for folder in sorted(root.iterdir()):
        if folder.is_dir() and folder.name != keep and not folder.name.startswith(".") and _ours(folder / "config.pbtxt"):
            shutil.rmtree(folder)
            removed.append(folder.name)
    return removed


def _ours(config: Path) -> bool:
    try:
        return config.read_text().startswith(MARKER)
    except OSError:
        return False


def _check_replaceable(target: Path) -> None:
    if target.exists() and not _ours(target / "config.pbtxt"):
        raise UserError(f"{target}: exists and was not written by `inceptionlab export`; move it away or "
                        "pass --name OTHER")


def _check_replaceable_file(path: Path) -> None:
    if path.exists() and not _ours(path):
        raise UserError(f"{path}: exists and was not written by `inceptionlab export`; move it away")


def _swap_into_place(staging: Path, target: Path) -> None:
    """Rename the finished folder into place; an older export of ours is moved aside first and
    removed only once the new one is in."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        target.rename(old)
    try:
        staging.rename(target)
    except BaseException:
        if old is not None:
            old.rename(target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
