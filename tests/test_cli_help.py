"""`inceptionlab --help` lists every command with a one-sentence summary that wraps as a paragraph: not
the first lines of its docstring cut where the source file broke them."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import typer

from inceptionlab.cli.app import app

# A wide terminal: every summary fits on its row, so a row that stops short was cut by a line break.
WIDE = {"TERMINAL_WIDTH": "200", "COLUMNS": "200"}
MAX_SUMMARY = 100  # characters: one row on a wide terminal, two at 80 columns


def first_sentence(help_text: str) -> str:
    paragraph = " ".join(help_text.split("\n\n")[0].split())
    return re.split(r"(?<=[.!?])\s+(?=[A-Z])", paragraph)[0]


def help_screen(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "inceptionlab", *args, "--help"], capture_output=True, text=True,
                          env={**os.environ, **WIDE}, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def panel_rows(screen: str) -> dict[str, str]:
    """The Commands panel: command name -> the text on its row."""
    rows = {}
    for line in screen.splitlines():
        match = re.match(r"│ (\S+) +(.*?) *│$", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


@pytest.mark.parametrize("group_path", [[], ["data"]], ids=["inceptionlab", "inceptionlab data"])
def test_the_command_list_shows_each_commands_first_sentence_on_its_row(group_path):
    group = typer.main.get_command(app)
    for name in group_path:
        group = group.commands[name]
    rows = panel_rows(help_screen(*group_path))
    for name, command in group.commands.items():
        summary = first_sentence(command.help or "")
        assert rows.get(name) == summary, f"{name}: {rows.get(name)!r} instead of {summary!r}"
        assert len(summary) <= MAX_SUMMARY, f"{name}: a summary of {len(summary)} characters: {summary!r}"
