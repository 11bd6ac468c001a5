"""`inceptionlab export --format triton`: a Triton model repository that Triton's own ModelConfig schema
accepts, and a KServe InferenceService manifest. (Triton itself cannot run here: no container.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import FAST, make_image_folder

from inceptionlab.errors import UserError

model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2",
                                       reason="tritonclient[grpc] is in the test extra")
text_format = pytest.importorskip("google.protobuf.text_format")
ort = pytest.importorskip("onnxruntime")


def parse_config(path):
    """Parse with Triton's ModelConfig protobuf: an unknown field or a wrong type raises."""
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """resnet18 trained one epoch on coloured squares at 75 px: a real run directory, fast to export."""
    from inceptionlab.config import load_recipe
    from inceptionlab.engine.fit import fit

    root = tmp_path_factory.mktemp("triton")
    data = make_image_folder(root / "data")
    recipe = load_recipe("inception_v3/imagefolder", [*FAST, f"data.root={data}", "train.epochs=1", "model.name=resnet18"])
    return fit(recipe, root / "runs", progress=False).run_dir


@pytest.fixture(scope="module")
def exported(small_run):
    import contextlib
    import io

    from inceptionlab.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        main(["export", str(small_run), "--format", "triton", "--max-batch", "8", "--instances", "2",
              "--accelerator", "openvino", "--max-delay-ms", "2", "--storage-uri", "s3://bucket/models", "--json"])
    assert exit_.value.code in (0, None), err.getvalue()
    return json.loads(out.getvalue())


def test_config_parses_with_tritons_schema_and_matches_the_graph(small_run, exported):
    triton = small_run / "exports" / "triton"
    assert exported["triton"]["root"] == str(triton)
    name = exported["triton"]["name"]
    config = parse_config(triton / name / "config.pbtxt")
    assert config.name == name and config.backend == "onnxruntime" and config.max_batch_size == 8
    (image,) = config.input
    assert image.name == "images" and list(image.dims) == [3, 75, 75]
    assert image.data_type == model_config_pb2.TYPE_FP32 and image.format == model_config_pb2.ModelInput.FORMAT_NCHW
    (logits,) = config.output
    assert logits.name == "logits" and list(logits.dims) == [3] and logits.data_type == model_config_pb2.TYPE_FP32
    assert logits.label_filename == "labels.txt"
    assert config.dynamic_batching.max_queue_delay_microseconds == 2000
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 256
    (group,) = config.instance_group
    assert group.count == 2 and group.kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    (accelerator,) = config.optimization.execution_accelerators.cpu_execution_accelerator
    assert accelerator.name == "openvino" and not config.optimization.execution_accelerators.gpu_execution_accelerator
    # Every batch size the batcher can form is warmed up before the model is ready.
    assert [w.batch_size for w in config.model_warmup] == [1, 2, 4, 8]
    assert all(list(w.inputs["images"].dims) == [3, 75, 75] and w.inputs["images"].zero_data
               for w in config.model_warmup)


def test_repository_layout_labels_and_the_model_runs_batched(small_run, exported):
    model_dir = small_run / "exports" / "triton" / exported["triton"]["name"]
    assert (model_dir / "labels.txt").read_text().splitlines() == ["cat", "dog", "fox"]
    onnx_file = model_dir / "1" / "model.onnx"
    assert onnx_file.read_bytes() == (small_run / "exports" / "model.onnx").read_bytes()
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    logits = session.run(["logits"], {"images": np.zeros((5, 3, 75, 75), np.float32)})[0]
    assert logits.shape == (5, 3)  # the batch axis is dynamic, as dynamic batching needs
    # no staging left
    assert sorted(p.name for p in (small_run / "exports" / "triton").iterdir()) == [exported["triton"]["name"]]


def test_kserve_manifest(small_run, exported):
    manifest = yaml.safe_load((small_run / "exports" / "kserve.yaml").read_text())
    assert manifest["apiVersion"] == "serving.kserve.io/v1beta1" and manifest["kind"] == "InferenceService"
    assert manifest["metadata"]["name"] == exported["triton"]["name"].replace("_", "-")  # resnet18-20261122-101500
    model = manifest["spec"]["predictor"]["model"]
    assert model["modelFormat"] == {"name": "triton"} and model["protocolVersion"] == "v2"
    assert model["storageUri"] == "s3://bucket/models" and model["runtime"] == "kserve-tritonserver"
    assert "nvidia.com/gpu" not in model["resources"]["limits"]


def test_gpu_accelerators_and_names(small_run, exported, tmp_path):
    from inceptionlab.infer.triton import TritonOptions, write_triton_repository
    from inceptionlab.models.spec import ModelSpec

    spec = ModelSpec.load(small_run / "spec.json")
    onnx_file = small_run / "exports" / "model.onnx"
    repo = write_triton_repository(onnx_file, spec, tmp_path / "triton",
                                   TritonOptions(name="Inception v3!", accelerator="tensorrt", instances=1))
    config = parse_config(repo.config)
    assert repo.name == "Inception_v3" and config.name == "Inception_v3"
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    assert config.optimization.execution_accelerators.gpu_execution_accelerator[0].name == "tensorrt"
    assert [w.batch_size for w in config.model_warmup] == [1, 2, 4, 8, 16, 32]
    manifest = yaml.safe_load(repo.kserve.read_text())
    assert manifest["metadata"]["name"] == "inception-v3"
    assert manifest["spec"]["predictor"]["model"]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    amd = write_triton_repository(onnx_file, spec, tmp_path / "triton", TritonOptions(name="m", accelerator="migraphx"))
    model = yaml.safe_load(amd.kserve.read_text())["spec"]["predictor"]["model"]
    assert model["resources"]["limits"]["amd.com/gpu"] == "1" and model["runtime"] == "tritonserver-rocm"
    assert parse_config(amd.config).optimization.execution_accelerators.gpu_execution_accelerator[0].name == "migraphx"


def test_rewrites_its_own_folder_but_never_a_foreign_one(small_run, exported, tmp_path):
    from inceptionlab.infer.triton import TritonOptions, write_triton_repository
    from inceptionlab.models.spec import ModelSpec

    spec = ModelSpec.load(small_run / "spec.json")
    onnx_file = small_run / "exports" / "model.onnx"
    root = tmp_path / "exports" / "triton"
    write_triton_repository(onnx_file, spec, root, TritonOptions(max_batch=4))
    again = write_triton_repository(onnx_file, spec, root, TritonOptions(max_batch=16))
    assert parse_config(again.config).max_batch_size == 16
    assert sorted(p.name for p in root.iterdir()) == ["resnet18"]
    foreign = root / "theirs"
    foreign.mkdir()
    (foreign / "config.pbtxt").write_text('name: "theirs"\n')
    with pytest.raises(UserError, match="not written by `inceptionlab export`"):
        write_triton_repository(onnx_file, spec, root, TritonOptions(name="theirs"))
    assert (foreign / "config.pbtxt").read_text() == 'name: "theirs"\n'
    with pytest.raises(UserError, match="--accelerator"):
        write_triton_repository(onnx_file, spec, root, TritonOptions(accelerator="tpu"))


def test_cli_refuses_static_batch_and_bad_format(small_run, cli):
    static = cli("export", small_run, "--format", "triton", "--static-batch")
    assert static.code != 0 and "drop --static-batch" in static.err
    bad = cli("export", small_run, "--format", "tensorrt")
    assert bad.code != 0 and "--format tensorrt" in bad.err


def test_one_channel_fashion_mnist_run(fashion_root, tmp_path, cli):
    data = fashion_root
    train = cli("train", "fashion_mnist/mlp", "--data", data, "--out", tmp_path / "runs", "--no-progress", "--json",
                "--set", "train.epochs=1", "--set", "data.max_train_samples=600", "--set", "data.max_val_samples=200")
    assert train.code == 0, train.err
    run = json.loads(train.out.strip().splitlines()[-1])["run_dir"]
    result = cli("export", run, "--format", "triton", "--max-batch", "64", "--json")
    assert result.code == 0, result.err
    triton = json.loads(result.out)["triton"]
    config = parse_config(Path(triton["config"]))
    assert config.name == f"fashion_mlp_{Path(run).name}" and config.max_batch_size == 64
    assert list(config.input[0].dims) == [1, 28, 28] and list(config.output[0].dims) == [10]
    labels = Path(triton["labels"]).read_text().splitlines()
    assert len(labels) == 10 and labels[9] == "Ankle boot"


# --------------------------------------------------------------------------------------- names and modes


DNS_1035 = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


def test_the_default_name_is_distinct_per_run_and_kserve_accepts_every_name(small_run, exported, tmp_path):
    import re

    from inceptionlab.infer.triton import TritonOptions, write_triton_repository
    from inceptionlab.models.spec import ModelSpec

    assert exported["triton"]["name"] == f"resnet18_{small_run.name}"  # two runs' exports can share a repository
    # `--name` goes to the repository writer as is (the CLI's --name: test_a_new_name_...); the export
    # itself does not depend on it, so the names are written from the one export, each repository apart.
    spec = ModelSpec.load(small_run / "spec.json")
    for index, name in enumerate(("9digits", "Inception v3!", "a" * 80, "run_20261122-101500")):
        repository = write_triton_repository(small_run / "exports" / "model.onnx", spec,
                                             tmp_path / str(index) / "triton", TritonOptions(name=name))
        kserve = yaml.safe_load(repository.kserve.read_text())["metadata"]["name"]
        assert re.match(DNS_1035, kserve) and len(kserve) <= 63, kserve


def test_a_new_name_takes_the_old_model_folder_out_of_the_repository(small_run, exported, cli):
    triton = small_run / "exports" / "triton"
    assert cli("export", small_run, "--format", "triton").code == 0
    assert sorted(p.name for p in triton.iterdir()) == [exported["triton"]["name"]]
    renamed = cli("export", small_run, "--format", "triton", "--name", "renamed")
    assert renamed.code == 0, renamed.err
    assert sorted(p.name for p in triton.iterdir()) == ["renamed"]  # Triton would have loaded both
    assert f"removed the earlier export {exported['triton']['name']}" in renamed.out


def test_exports_are_readable_by_other_users(small_run, tmp_path):
    import os

    from inceptionlab.infer.triton import TritonOptions, write_triton_repository
    from inceptionlab.models.spec import ModelSpec

    previous = os.umask(0o022)
    try:
        repo = write_triton_repository(small_run / "exports" / "model.onnx", ModelSpec.load(small_run / "spec.json"),
                                       tmp_path / "exports" / "triton", TritonOptions(name="m"))
    finally:
        os.umask(previous)
    assert repo.model_dir.stat().st_mode & 0o777 == 0o755 and (repo.model_dir / "1").stat().st_mode & 0o777 == 0o755
    for path in (repo.config, repo.labels, repo.onnx, repo.kserve):
        assert path.stat().st_mode & 0o777 == 0o644, path


def test_the_triton_release_the_opset_needs_is_said(small_run, cli):
    result = cli("export", small_run, "--format", "triton")
    assert result.code == 0, result.err
    assert "opset 20 needs ONNX Runtime 1.17 or newer: Triton 24.04 or newer" in result.out
    config = next((small_run / "exports" / "triton").glob("*/config.pbtxt")).read_text()
    assert "Triton 24.04 or newer" in config
