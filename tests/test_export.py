"""`inceptionlab export`: parity with PyTorch, the sidecar, dynamic batch, bad inputs, atomicity."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import torchvision
from helpers.page_examples import check_example

from inceptionlab.errors import UserError
from inceptionlab.models.spec import ModelSpec

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def small_run(squares_run):
    """resnet18 trained on coloured squares at 75 px: a real run directory, fast to export."""
    return squares_run.run_dir


@pytest.fixture(scope="module")
def exported(small_run, cli_module):
    """The export as a user runs it (its lines are fast-inference.md's example); its record from the sidecar."""
    result = cli_module("export", small_run)
    assert result.code == 0, result.err
    onnx_file = small_run / "exports" / "model.onnx"
    sidecar = json.loads((small_run / "exports" / "model.onnx.json").read_text())
    return {"printed": result.out, "path": str(onnx_file), "parity": sidecar["parity"]}


def test_the_export_prints_what_the_pages_show(exported):
    check_example("fast-inference-export", exported["printed"])
    check_example("case-studies-export", exported["printed"])


@pytest.fixture(scope="module")
def cli_module():
    """The `cli` fixture for module-scoped fixtures (stdout captured by hand)."""
    import contextlib
    import io

    from conftest import CliResult

    from inceptionlab.cli.app import main

    def run(*args):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main([str(a) for a in args])
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
        return CliResult(code, out.getvalue(), err.getvalue())

    return run


def test_export_writes_onnx_and_sidecar_after_parity_on_real_images(small_run, exported):
    onnx_file = small_run / "exports" / "model.onnx"
    assert exported["path"] == str(onnx_file) and onnx_file.is_file()
    parity = exported["parity"]
    # 5 sample pictures + the run's 9 val images, all real; fp32 ORT vs PyTorch agree to rounding.
    assert parity["ok"] and parity["real_images"] and parity["images"] >= 9
    assert parity["max_rel_err"] < 1e-4 and parity["top1_agreement"] == 1.0
    meta = json.loads((small_run / "exports" / "model.onnx.json").read_text())
    spec = ModelSpec.load(small_run / "spec.json")
    assert meta["classes"] == spec.labels == ["cat", "dog", "fox"]
    assert meta["preprocessing"]["center_crop"] == 75 and meta["preprocessing"]["mean"] == spec.mean
    assert meta["opset"] == 20 and meta["input"]["shape"] == ["batch", 3, 75, 75]
    assert meta["sha256"] and len(meta["source"]["weights_sha256"]) == 64
    model = onnx.load(str(onnx_file))
    assert model.opset_import[0].version == 20
    props = {p.key: p.value for p in model.metadata_props}
    assert json.loads(props["inceptionlab.spec"])["class_names"] == ["cat", "dog", "fox"]


def test_exported_graph_has_a_dynamic_batch_and_matches_pytorch(small_run, exported):
    from inceptionlab.infer.inputs import random_inputs
    from inceptionlab.infer.parity import torch_logits
    from inceptionlab.infer.source import load_source

    source = load_source(run_dir=small_run)
    session = ort.InferenceSession(exported["path"], providers=["CPUExecutionProvider"])
    [inp], [out] = session.get_inputs(), session.get_outputs()
    assert (inp.name, out.name) == ("images", "logits") and isinstance(inp.shape[0], str)
    x = random_inputs(3, (3, 75, 75))
    got = session.run(None, {"images": x})[0]
    assert got.shape == (3, 3)
    np.testing.assert_allclose(got, torch_logits(source.model, x), rtol=1e-4, atol=1e-4)


def test_current_export_is_reused_only_for_the_same_weights(small_run, exported):
    from inceptionlab.infer.export import current_export
    from inceptionlab.infer.source import load_source

    source = load_source(run_dir=small_run)
    assert current_export(source) == small_run / "exports" / "model.onnx"
    source.weights_sha256 = "0" * 64  # as if the run had been trained further
    assert current_export(source) is None


def test_static_batch_and_older_opset(small_run, tmp_path, cli):
    run = shutil.copytree(small_run, tmp_path / "run")
    result = cli("export", run, "--static-batch", "--opset", "18", "--json")
    assert result.code == 0, result.err
    model = onnx.load(str(run / "exports" / "model.onnx"))
    assert model.opset_import[0].version == 18
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1


def test_parity_failure_is_loud_and_writes_nothing(small_run, tmp_path, cli, monkeypatch):
    import inceptionlab.infer.parity as parity

    run = shutil.copytree(small_run, tmp_path / "run", ignore=shutil.ignore_patterns("exports"))
    real = parity.onnx_logits
    monkeypatch.setattr(parity, "onnx_logits", lambda *a, **k: real(*a, **k) * 1.01)  # a 1% scale bug
    result = cli("export", run)
    assert result.code == 2
    assert "parity failed, nothing written" in result.err and "max rel err" in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert not (run / "exports").exists() or not any((run / "exports").iterdir())


def test_parity_rule_allows_only_near_tie_flips():
    from inceptionlab.infer.parity import compare_logits

    reference = np.array([[5.0, 1.0, 0.0], [2.0, 1.999999, 0.0]])
    near_tie_flip = np.array([[5.0, 1.0, 0.0], [1.999998, 1.999999, 0.0]])
    assert compare_logits(reference, near_tie_flip, real=True).ok  # margin 1e-6 < error 2e-6
    clear_flip = np.array([[0.9, 1.0, 0.0], [2.0, 1.999999, 0.0]])
    parity = compare_logits(reference, clear_flip, real=True)
    assert not parity.ok and parity.top1_agree == 1


@pytest.fixture(scope="module")
def inception_run_with_aux(tmp_path_factory):
    """A run directory as training with an aux loss leaves it: Inception v3 with its AuxLogits head."""
    run = tmp_path_factory.mktemp("inception_aux")
    torch.manual_seed(0)
    kwargs = {"aux_logits": True, "transform_input": False, "init_weights": False}
    model = torchvision.models.inception_v3(weights=None, num_classes=4, **kwargs)
    ModelSpec("inception_v3", 4, ["a", "b", "c", "d"], arch_kwargs=kwargs).save(run / "spec.json")
    torch.save(model.state_dict(), run / "model.pt")
    return run


@pytest.mark.slow  # traces Inception v3 at 299 px to ONNX and checks parity
def test_inception_exports_in_eval_mode_without_its_aux_head(inception_run_with_aux, cli):
    result = cli("export", inception_run_with_aux, "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["parity"]["ok"]
    model = onnx.load(str(inception_run_with_aux / "exports" / "model.onnx"))
    assert [o.name for o in model.graph.output] == ["logits"]
    assert not [i.name for i in model.graph.initializer if "aux" in i.name.lower()]
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim][1:] == [3, 299, 299]


def test_bad_opset_and_bad_weights_are_one_line_errors(small_run, tmp_path, cli):
    result = cli("export", small_run, "--opset", "7")
    assert result.code == 2 and "--opset 7" in result.err
    truncated = tmp_path / "model.pt"
    truncated.write_bytes((small_run / "model.pt").read_bytes()[:1000])
    result = cli("export", small_run, "--weights", truncated)
    assert result.code == 2 and str(truncated) in result.err and "truncated" in result.err
    assert len(result.err.strip().splitlines()) == 1
    result = cli("export", small_run, "--model", "resnet18")
    assert result.code == 2 and "one of them" in result.err


def _tiny_onnx(path, classes: int, size: int) -> None:
    """A valid ONNX classifier of another architecture: global pool over the image -> `classes` outputs."""
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((3, classes), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["images"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
         helper.make_node("MatMul", ["f", "w"], ["logits"])],
        "other", [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), str(path))


def test_model_files_that_are_truncated_foreign_or_not_onnx_are_rejected(small_run, exported, tmp_path, cli):
    good = (small_run / "exports" / "model.onnx").read_bytes()
    (tmp_path / "truncated.onnx").write_bytes(good[: len(good) // 2])
    (tmp_path / "notes.onnx").write_text("this is not a model")
    _tiny_onnx(tmp_path / "other_arch.onnx", classes=1000, size=224)
    for name, words in (("truncated.onnx", "truncated"), ("notes.onnx", "not a readable ONNX"),
                        ("other_arch.onnx", "another model"), ("missing.onnx", "not found")):
        result = cli("bench", small_run, "--onnx", tmp_path / name, "--backend", "onnxruntime", "--iters", "1",
                     "--warmup", "0", "--no-plot")
        assert result.code == 2, (name, result.err)
        last = result.err.strip().splitlines()[-1]
        assert last.startswith("error: ") and str(tmp_path / name) in last and words in last, (name, last)
    _tiny_onnx(tmp_path / "ok.onnx", classes=3, size=75)  # right shapes: accepted and timed
    result = cli("bench", small_run, "--onnx", tmp_path / "ok.onnx", "--backend", "onnxruntime", "--iters", "2",
                 "--warmup", "0", "--json", "--no-plot")
    assert result.code == 0, result.err


def test_check_onnx_file_names_the_expected_shapes(tmp_path):
    from inceptionlab.infer.onnx_graph import check_onnx_file

    _tiny_onnx(tmp_path / "m.onnx", classes=10, size=32)
    spec = ModelSpec("resnet18", 3, ["a", "b", "c"], crop_size=32, resize_size=32)
    with pytest.raises(UserError, match=r"\[batch, 3\]"):
        check_onnx_file(tmp_path / "m.onnx", spec)


def test_a_text_run_is_refused_with_a_pointer(tmp_path, cli):
    run = tmp_path / "text_run"
    run.mkdir()
    ModelSpec("text_classifier", 2, ["neg", "pos"], input_kind="tokens").save(run / "spec.json")
    result = cli("export", run)
    assert result.code == 2 and "takes tokens, not images" in result.err and "exports/text/" in result.err
    check_example("case-studies-text-export", result.err)


def test_out_with_a_run_is_refused_not_ignored(small_run, tmp_path, cli):
    """A run's export goes to RUN/exports/ (serve and bench find it there); `--out` is for --model. Given with
    a run it was silently ignored: the user looked for the file where they asked for it."""
    elsewhere = tmp_path / "elsewhere"
    result = cli("export", small_run, "--out", elsewhere)
    assert result.code == 2 and not elsewhere.exists()
    assert "--out" in result.err and f"{small_run}/exports/" in result.err
    assert len(result.err.strip().splitlines()) == 1
