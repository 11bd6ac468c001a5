"""The `inceptionlab` program: the Typer app, each command module registered on it, and the entry point.

`inceptionlab` (pyproject's console script) and `python -m inceptionlab` both run `program`. Each
command imports what it runs inside its function, so `inceptionlab --help` starts in ~0.2 s
instead of importing torch, torchvision and ONNX (~3.5 s) for every call.

Every command turns `UserError` into a one-line `error: ...` on stderr and a non-zero exit,
never a traceback.
"""

from __future__ import annotations

import gc
import sys

import typer

# The command modules import only typer and the shared options at the top: what a command runs is
# imported inside it, so registering all of them costs no start-up time.
from inceptionlab.cli import bench, data, demo, doctor, evaluate, export, loadtest, plot, predict, serve, train
from inceptionlab.errors import UserError

app = typer.Typer(
    name="inceptionlab",
    help="Inception v3 and the ROCm Deep Learning Guide's case studies: train, evaluate, predict, check.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    for module in (doctor, train, evaluate, predict, export, bench, plot, demo, serve, loadtest):
        module.register(app)
    app.add_typer(data.app, name="data")


_register()


def main(argv: list[str] | None = None) -> None:
    # Before any command imports torch: MIOpen reads its cache locations once, at load (hardware.py).
    from inceptionlab.hardware import prepare_process_environment

    prepare_process_environment()
    try:
        app(args=argv, prog_name="inceptionlab", standalone_mode=True)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


def program() -> None:
    """The `inceptionlab` program (console script and `python -m inceptionlab`): `main`, then exit.

    As the process ends, objects are moved out of the collector's reach (`gc.freeze`): the
    interpreter's final collections over torch's (and torch._dynamo's) objects took 1.0-1.2 s of
    every command's exit on an AMD EPYC, 0.3 s after freezing. Only the garbage collector is
    skipped: atexit handlers, module teardown and file flushing run as before. Not in `main`, which
    tests and notebooks call in a process that goes on.
    """
    try:
        main()
    finally:
        gc.freeze()
