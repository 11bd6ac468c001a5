"""The CLI's shared options: one definition per option, the run directory given the same way everywhere,
and bench's recorded command line reruns the row exactly."""

from __future__ import annotations

import shlex
import sys

import pytest
import typer

from inceptionlab.cli import options
from inceptionlab.cli.app import app
from inceptionlab.errors import UserError
from inceptionlab.runtime import DEVICE_HELP

RUN_COMMANDS = ("evaluate", "export", "bench", "plot", "predict")


def _command(name: str):
    return typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]


def _option(command, flag: str):
    return next((p for p in command.params if p.param_type_name == "option" and flag in p.opts), None)


def test_device_help_matches_the_resolver():
    assert options.DEVICE_HELP == DEVICE_HELP


@pytest.mark.parametrize("name", RUN_COMMANDS)
def test_every_run_command_takes_run_model_weights_device_the_same_way(name):
    command = _command(name)
    run = _option(command, "--run")
    assert run is not None and run.default is None and "run directory" in run.help
    for flag in ("--model", "--weights"):
        if name == "plot":
            continue
        option = _option(command, flag)
        assert option is not None and option.default is None, f"{name} {flag}"
    weights = [_option(_command(n), "--weights").help for n in RUN_COMMANDS if n != "plot"]
    assert len(set(weights)) == 1  # one help text for one option
    devices = [_option(_command(n), "--device") for n in ("evaluate", "bench", "predict")]
    assert {(d.default, d.help) for d in devices} == {("auto", f"Where to run: {DEVICE_HELP}.")}


def test_run_positional_and_option_are_the_same_thing(tmp_path):
    assert options.pick_run(tmp_path, None) == tmp_path
    assert options.pick_run(None, tmp_path) == tmp_path
    assert options.pick_run(tmp_path, tmp_path) == tmp_path
    with pytest.raises(UserError, match="two run directories"):
        options.pick_run(tmp_path / "a", tmp_path / "b")
    with pytest.raises(UserError, match="one of them"):
        options.pick_source(None, None)
    with pytest.raises(UserError, match="one of them"):
        options.pick_source(tmp_path, "inception_v3")


def test_bench_command_line_reruns_with_every_option(tmp_path):
    bench = _command("bench")
    given = [str(tmp_path), "--backend", "eager,onnxruntime", "--precision", "fp32,int8", "--batch", "1,8",
             "--calib-images", str(tmp_path / "calib"), "--holdout", "50", "--min-agreement", "0.98", "--tune",
             "--no-plot", "--json"]
    ctx = bench.make_context("inceptionlab bench", list(given))
    recorded = options.canonical_command(ctx, skip=("as_json", "plot", "list_runtimes"))
    assert recorded.startswith(f"inceptionlab bench {tmp_path} --backend eager,onnxruntime --precision fp32,int8")
    again = bench.make_context("inceptionlab bench", shlex.split(recorded)[2:])
    skipped = {"as_json", "plot", "list_runtimes"}
    assert {k: v for k, v in again.params.items() if k not in skipped} == \
           {k: v for k, v in ctx.params.items() if k not in skipped}
    for flag in ("--calib-images", "--holdout", "--min-agreement", "--calibration", "--iters", "--warmup",
                 "--device", "--provider", "--layout", "--tune"):
        assert f" {flag}" in recorded, flag
    assert " --out" not in recorded  # a --model's folder: with a run it is refused, so never recorded


def test_serve_takes_runs_weights_and_device_like_the_other_commands():
    serve = _command("serve")
    run = _option(serve, "--run")
    assert run is not None and run.multiple and "run directory" in run.help
    assert _option(serve, "--weights").help == _option(_command("bench"), "--weights").help
    assert _option(serve, "--device").help == _option(_command("evaluate"), "--device").help


def test_the_program_freezes_the_collector_as_it_exits_with_mains_code(monkeypatch):
    import gc

    import inceptionlab.cli.app as cli_module

    frozen = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(True))
    monkeypatch.setattr(cli_module, "main", lambda: sys.exit(3))
    with pytest.raises(SystemExit) as caught:
        cli_module.program()
    assert caught.value.code == 3 and frozen == [True]


def _modules_after(code: str) -> list[str]:
    """The modules a fresh interpreter holds after running `code` (which may exit, as --help does)."""
    import json
    import subprocess

    script = f"import json, sys\ntry:\n    {code}\nexcept SystemExit:\n    pass\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_command_module_imports_alone_the_package_file_pulls_in_nothing():
    """No cycle through cli/__init__.py: a command module needs the package, the package needs no command."""
    loaded = _modules_after("import inceptionlab.cli.bench")
    assert [m for m in loaded if m.startswith("inceptionlab.cli")] == [
        "inceptionlab.cli", "inceptionlab.cli.bench", "inceptionlab.cli.options"]


def test_help_starts_without_torch_and_the_console_script_names_the_program():
    import importlib
    import re
    from pathlib import Path

    loaded = _modules_after("from inceptionlab.cli.app import main; main(['--help'])")
    assert "inceptionlab.cli.app" in loaded and not [m for m in loaded if m == "torch" or m.startswith("torch.")]
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    [script] = re.findall(r'^inceptionlab = "([\w.:]+)"$', pyproject, re.MULTILINE)  # [project.scripts]
    module, _, attribute = script.partition(":")
    assert getattr(importlib.import_module(module), attribute) is importlib.import_module("inceptionlab.cli.app").program
