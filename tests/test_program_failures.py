"""The program's own failures keep their cause: the CLI logs the traceback and exits 70 with one line;
--debug and INCEPTIONLAB_DEBUG=1 re-raise it. The user's mistakes stay one-line errors (exit 2)."""

from __future__ import annotations

import logging

import pytest
import torch

from inceptionlab.cli.app import main
from inceptionlab.errors import INTERNAL_ERROR_EXIT, ProgramError, UserError

pytest.importorskip("onnxruntime")

# resnet18 with random weights at 64 px: exported in a few seconds.
EXPORT = ["export", "--model", "resnet18", "--weights", "random", "--json"]


@pytest.fixture
def exporter_cannot_convert(monkeypatch):
    """The model ends in an op with no ONNX translation (torch.special.airy_ai): torch.onnx's real
    converter fails in step 3/3, as it does for any model with an op it cannot express."""
    from inceptionlab.infer import export

    forward = export._Logits.forward
    monkeypatch.setattr(export._Logits, "forward", lambda self, images: torch.special.airy_ai(forward(self, images)))


def test_an_exporter_crash_logs_its_traceback_and_exits_70_with_one_line(exporter_cannot_convert, tmp_path, cli):
    result = cli(*EXPORT, "--out", tmp_path / "exports")
    assert result.code == INTERNAL_ERROR_EXIT == 70
    lines = result.err.strip().splitlines()
    assert lines[-1].startswith("error: torch.onnx could not export this model (ConversionError: ")
    assert "--debug or INCEPTIONLAB_DEBUG=1 re-raises it" in lines[-1]
    # The whole chain is logged: the exporter's own exception, then ours raised from it.
    assert "ERROR inceptionlab.cli.app: the program failed" in result.err
    assert "Traceback (most recent call last)" in result.err
    assert "torch.onnx._internal.exporter._errors.ConversionError" in result.err
    assert "The above exception was the direct cause of the following exception" in result.err
    assert not list((tmp_path / "exports").rglob("model.onnx"))


@pytest.mark.parametrize("how", ["--debug", "INCEPTIONLAB_DEBUG=1"])
def test_debug_reraises_the_failure_with_its_cause(exporter_cannot_convert, tmp_path, monkeypatch, how):
    args = [*EXPORT, "--out", str(tmp_path / "exports")]
    if how == "--debug":
        args = ["--debug", *args]
    else:
        monkeypatch.setenv("INCEPTIONLAB_DEBUG", "1")
    with pytest.raises(ProgramError, match="torch.onnx could not export this model") as info:
        main(args)
    assert type(info.value.__cause__).__name__ == "ConversionError"


def test_a_user_error_stays_one_line_with_exit_2(tmp_path, cli):
    result = cli("export", tmp_path / "no-such-run")
    assert result.code == 2
    assert result.err.strip().count("\n") == 0 and result.err.startswith("error: ")
    assert "Traceback" not in result.err


def test_logging_is_configured_per_command_not_at_import(cli, caplog):
    package = logging.getLogger("inceptionlab")
    assert not [h for h in package.handlers if h.get_name() == "inceptionlab-cli"]  # importing set up nothing
    assert cli("--verbose", "recipes").code == 0
    assert cli("recipes").code == 0
    assert not [h for h in package.handlers if h.get_name() == "inceptionlab-cli"]  # removed after each command


def onnx_with_an_op_onnxruntime_lacks(path):
    """A valid ONNX graph (onnx.checker passes it) with a node of a custom domain: ONNX Runtime has no
    kernel for it, as when an export uses an op newer than the installed runtime."""
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Frobnicate", ["images"], ["logits"], domain="ai.example")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("ai.example", 1)],
                              ir_version=9)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def test_onnxruntime_failing_to_load_a_checked_graph_is_the_programs_failure(tmp_path):
    from inceptionlab.infer.runtimes import ORT_PROVIDERS, OrtSession, Target

    model = onnx_with_an_op_onnxruntime_lacks(tmp_path / "model.onnx")
    cpu = ORT_PROVIDERS["cpu"]
    with pytest.raises(ProgramError, match=r"onnxruntime could not load it with CPUExecutionProvider") as info:
        OrtSession(model, cpu, "fp32", Target("cpu"), 1, tmp_path / "cache", (3,))
    assert not isinstance(info.value, UserError) and info.value.__cause__ is not None
    assert "Frobnicate" in str(info.value.__cause__)
