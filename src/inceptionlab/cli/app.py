"""The `inceptionlab` program: the Typer app, each command module registered on it, and the entry point.

`inceptionlab` (pyproject's console script) and `python -m inceptionlab` both run `program`. Each
command imports what it runs inside its function, so `inceptionlab --help` starts in ~0.2 s
instead of importing torch, torchvision and ONNX (~3.5 s) for every call.

Every command turns `UserError` into a one-line `error: ...` on stderr and a non-zero exit,
never a traceback. Any other exception is the program's own failure: its traceback is logged (the
`inceptionlab` loggers, standard `logging`, configured here once per command, never at import), a
one-line summary follows, and the exit status is `INTERNAL_ERROR_EXIT` (70); `--debug` or
INCEPTIONLAB_DEBUG=1 re-raise it instead, with the full traceback.
"""

from __future__ import annotations

import gc
import inspect
import logging
import os
import re
import sys
import warnings
from dataclasses import dataclass

import typer

# The command modules import typer, the shared options and torch-free helpers (errors, fileio, hardware)
# at the top: what a command runs (torch, matplotlib) is imported inside it, so registering all of them
# costs no start-up time.
from inceptionlab import __version__, host
from inceptionlab.cli import (
    bench, compare, data, demo, doctor, evaluate, export, loadtest, lr_find, plot, predict, report, serve, train,
)
from inceptionlab.errors import INTERNAL_ERROR_EXIT, UserError, summary_of
from inceptionlab.hardware import prepare_process_environment

app = typer.Typer(
    name="inceptionlab",
    help="Inception v3 and the ROCm Deep Learning Guide's case studies: train, evaluate, predict, check.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


DEBUG_ENV = "INCEPTIONLAB_DEBUG"
# The commands whose speed was measured with freed blocks kept in the heap (host.keep_freed_memory):
# training's data path and steps (train, demo, and evaluate's loaders) and bench's batches. `serve`
# keeps glibc's defaults: a long-running server would hold up to 1 GiB per arena of whatever a burst
# of large requests freed, for as long as it runs.
HEAP_COMMANDS = ("train", "demo", "evaluate", "bench")
PACKAGE_LOGGER = "inceptionlab"
_HANDLER_NAME = "inceptionlab-cli"
log = logging.getLogger(__name__)


@dataclass
class _Invocation:
    """What the global options asked for, for the command that runs now (main() resets it)."""

    debug: bool = False


_invocation = _Invocation()


@app.callback()
def _global_options(
    ctx: typer.Context,
    debug: bool = typer.Option(False, "--debug", help=f"Log at DEBUG level, and let the program's own failures "
                               f"raise with their full traceback instead of exiting {INTERNAL_ERROR_EXIT} "
                               f"(also {DEBUG_ENV}=1)."),
    verbose: bool = typer.Option(False, "--verbose", help="Log at INFO level (the default is WARNING)."),
    version: bool = typer.Option(False, "--version", is_eager=True, callback=lambda value: _print_version(value),
                                 help="Print the program's version and exit."),
) -> None:
    _invocation.debug = _invocation.debug or debug
    configure_logging(logging.DEBUG if _invocation.debug else logging.INFO if verbose else logging.WARNING)
    quiet_image_warnings()
    if ctx.invoked_subcommand in HEAP_COMMANDS:
        host.keep_freed_memory()  # large tensors reused instead of unmapped and faulted in again (host.py)


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"inceptionlab {__version__}")
        raise typer.Exit()


def configure_logging(level: int) -> None:
    """The package's loggers write `LEVEL logger: message` lines to stderr from `level` up.

    Only the `inceptionlab` logger is configured (uvicorn, grpc and torch keep their own), and its
    records still propagate to the root logger (pytest's caplog, an embedding application's handlers).
    """
    package = logging.getLogger(PACKAGE_LOGGER)
    _remove_handler()
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    package.addHandler(handler)
    package.setLevel(level)


def _remove_handler() -> None:
    package = logging.getLogger(PACKAGE_LOGGER)
    for handler in [h for h in package.handlers if h.get_name() == _HANDLER_NAME]:
        package.removeHandler(handler)


def quiet_image_warnings() -> None:
    """Silence PIL's per-file warnings for this command's process: images between its decompression-bomb
    limit (89 Mpx) and twice that decode fine and are resized anyway (above, decoding fails with a one-line
    error), and phone photos often carry EXIF blocks PIL calls corrupt; a warning per file would drown
    `predict`'s and the server's output. Set here, once, by the application: the decoder used to wrap each
    call in `warnings.catch_warnings()`, which swaps the process-wide filter list and, from the server's
    decoding threads, could leave one thread's filters installed for good. DataLoader workers fork from
    this process and inherit the filters."""
    warnings.filterwarnings("ignore", message=r"Image size \(\d+ pixels\) exceeds limit", module=r"PIL\.Image$")
    warnings.filterwarnings("ignore", category=UserWarning, module=r"PIL\.TiffImagePlugin$")  # EXIF blocks


def _debug_from_env() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _report_program_failure(exc: Exception) -> None:
    """The traceback (with its chained causes) to the log, then one line that says what failed."""
    log.error("the program failed (a bug or a broken installation, not your input); traceback:", exc_info=exc)
    print(f"error: {summary_of(exc)} (internal failure, traceback above; --debug or {DEBUG_ENV}=1 re-raises it)",
          file=sys.stderr)


# `inceptionlab --help` lists a command by its docstring's first paragraph with the source file's line
# breaks kept (Typer's rich markup mode): lr-find's row stopped at "... one value per training step,
# from". Each command is listed by its first sentence, on one line, instead: the row docs/cli.md shows too.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def command_summary(help_text: str | None) -> str:
    """The first sentence of a command's help, on one line."""
    paragraph = " ".join(inspect.cleandoc(help_text or "").split("\n\n")[0].split())
    return SENTENCE_END.split(paragraph)[0]


def _list_by_summary(group: typer.Typer) -> None:
    for info in group.registered_commands:
        if info.short_help is None:
            info.short_help = command_summary(info.help or inspect.getdoc(info.callback))


def _register() -> None:
    for module in (doctor, train, lr_find, evaluate, report, compare, predict, export, bench, plot, demo, serve,
                   loadtest):
        module.register(app)
    app.add_typer(data.app, name="data")
    for group in (app, data.app):
        _list_by_summary(group)


_register()


def main(argv: list[str] | None = None) -> None:
    prepare_process_environment()  # before any command imports torch: MIOpen reads its cache locations once
    _invocation.debug = _debug_from_env()
    try:
        app(args=argv, prog_name="inceptionlab", standalone_mode=True)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit as exc:
        if _from_ctrl_c(exc):  # Typer turns Ctrl-C into a silent exit 130: say what happened
            print("interrupted", file=sys.stderr)
        raise
    except Exception as exc:  # the program's own failure: logged with its traceback, never swallowed
        if _invocation.debug:
            raise
        _report_program_failure(exc)
        sys.exit(INTERNAL_ERROR_EXIT)
    finally:
        _remove_handler()  # the stream it holds belongs to this call (tests run many in one process)


def _from_ctrl_c(exc: BaseException) -> bool:
    """True for the exit Typer makes of a KeyboardInterrupt (click's Exit(130), raised from it)."""
    seen: BaseException | None = exc
    for _ in range(5):  # SystemExit <- click Exit <- KeyboardInterrupt: a short chain
        if seen is None:
            return False
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


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
