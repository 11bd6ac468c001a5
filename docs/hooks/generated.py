"""MkDocs hook: the parts of the docs that are drawn from the code and from result files at build time.

- `<!-- cli-reference -->` becomes every command's own `--help`, walked from the Typer app behind the
  `inceptionlab` console script (typer's `get_command`, click's `get_help`): the reference cannot
  drift from the program, and nothing is copied by hand.
- docs/cli.md's table of commands (between `<!-- commands -->` and `<!-- /commands -->`) is written
  into the file itself, so the page is useful in the repository too: `python docs/hooks/generated.py`
  rewrites it from the program, and tests/test_docs.py fails while it is out of date.
- `<!-- results: NAME -->` becomes the tables of benchmarks/results/NAME--<machine>--<time>.json (the
  newest file per machine), each headed by the CPU or GPU it was measured on, through
  benchmarks/_results.py, the module that writes those files.

Both run in the build (`make docs`, `mkdocs build --strict`) and need no network.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[2]
PROGRAM = "inceptionlab"
HELP_WIDTH = 100  # characters per help line: what a wide terminal shows, and fits a docs page's code block
MARKER = re.compile(r"<!-- (cli-reference|results: ([a-z0-9_]+)) -->")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return MARKER.sub(lambda match: expand(match.group(1), match.group(2)), markdown)


def expand(marker: str, benchmark: str | None) -> str:
    if benchmark is not None:
        return results_module().render_benchmark(benchmark)
    return cli_reference(typer_app())


def results_module() -> ModuleType:
    """benchmarks/_results.py, loaded from its file (benchmarks/ is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("_benchmark_results", REPO / "benchmarks" / "_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def typer_app() -> Any:
    """The Typer app behind the console script: its module as the entry point names it, else the usual homes."""
    import typer

    modules = [ep.module for ep in entry_points(group="console_scripts", name=PROGRAM)]
    for name in [*modules, f"{PROGRAM}.cli", f"{PROGRAM}.cli.app"]:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # the module exists but something it imports is missing: say so
                raise
            continue
        app = getattr(module, "app", None)
        if isinstance(app, typer.Typer):
            return app
    raise RuntimeError(f"no Typer app found in {', '.join(modules)}, {PROGRAM}.cli or {PROGRAM}.cli.app")


def cli_reference(app: Any) -> str:
    """Every command's `--help`, one section each, in the order `inceptionlab --help` lists them."""
    import typer.main

    sections = []
    for path, command, ctx in walk(typer.main.get_command(app), [PROGRAM]):
        title = " ".join(path)
        sections.append(f"## {title}\n\n```text\n{plain_help(command, ctx)}\n```")
    return "\n\n".join(sections)


def walk(command: Any, path: list[str], parent: Any = None) -> Iterator[tuple[list[str], Any, Any]]:
    ctx = command.context_class(command, info_name=path[-1], parent=parent, terminal_width=HELP_WIDTH,
                                max_content_width=HELP_WIDTH)
    yield path, command, ctx
    for name in getattr(command, "list_commands", lambda ctx: [])(ctx):
        sub = command.get_command(ctx, name)
        if not getattr(sub, "hidden", False):
            yield from walk(sub, [*path, name], ctx)


COMMANDS_START, COMMANDS_END = "<!-- commands -->", "<!-- /commands -->"
CLI_PAGE = REPO / "docs" / "cli.md"


def command_table(app: Any) -> str:
    """One row per command: its name and its row in `--help` (its first sentence), in that order."""
    import typer.main

    rows = ["| command | what it does |", "|---|---|"]
    for path, command, _ in walk(typer.main.get_command(app), [PROGRAM]):
        if len(path) < 2 or hasattr(command, "list_commands"):
            continue  # the program itself and command groups
        summary = command.get_short_help_str(limit=1000)  # the CLI lists each command by its first sentence
        summary = summary.replace("|", "/").replace("<", "&lt;").replace(">", "&gt;")
        rows.append(f"| `{' '.join(path)}` | {summary} |")
    return "\n".join(rows)


def with_command_table(page: str, table: str) -> str:
    """`page` with the block between the commands markers replaced by `table`."""
    start, end = page.index(COMMANDS_START) + len(COMMANDS_START), page.index(COMMANDS_END)
    return page[:start] + "\n" + table + "\n" + page[end:]


def plain_help(command: Any, ctx: Any) -> str:
    # Typer draws help with Rich (boxes, colours) straight to the terminal when Rich is installed;
    # without a markup mode it formats the same words as plain text and returns them.
    command.rich_markup_mode = None
    return command.get_help(ctx).rstrip()


if __name__ == "__main__":  # python docs/hooks/generated.py: rewrite docs/cli.md's table of commands
    CLI_PAGE.write_text(with_command_table(CLI_PAGE.read_text(), command_table(typer_app())))
    print(f"wrote the table of commands in {CLI_PAGE}")
