"""`inceptionlab data ...`: get data sets into the layout the trainers read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from inceptionlab.cli import options

app = typer.Typer(
    help="Download and prepare data sets (Tiny ImageNet).",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def data() -> None:
    """Download and prepare data sets (Tiny ImageNet)."""
    # A callback keeps `data` a command group even while it has a single command.


@app.command("tiny-imagenet")
def tiny_imagenet(
    root: Path = typer.Option(
        ..., "--root", help="Folder that contains (or will contain) tiny-imagenet-200/, or that folder itself."),
    archive: Optional[Path] = typer.Option(
        None, "--archive", help="Use this local tiny-imagenet-200.zip instead of downloading it."),
    as_json: bool = options.json_option("the report as one object"),
) -> None:
    """Download/extract Tiny ImageNet and move val images into val/<wnid>/images/ (safe to re-run)."""
    from inceptionlab.data.datasets.tiny_imagenet import prepare_tiny_imagenet

    report = prepare_tiny_imagenet(root, archive=archive)
    if as_json:
        typer.echo(json.dumps(report.to_dict()))
        return
    typer.echo(format_report(report))


def format_report(report) -> str:
    def labelled(split) -> str:
        return f"{split.images:>6} images ({split.per_class_min}-{split.per_class_max} per class)"

    return "\n".join([
        f"Tiny ImageNet ready at {report.dataset}",
        f"  classes {report.classes:>6}",
        f"  train   {labelled(report.train)}",
        f"  val     {labelled(report.val)}",
        f"  test    {report.test.images:>6} images",
        f"  this run: {'downloaded the zip, ' if report.downloaded else ''}"
        f"extracted {report.extracted} files, moved {report.moved} val images",
    ])


def register(root: typer.Typer) -> None:
    """Nothing to do: the CLI mounts `app` itself as `inceptionlab data`."""
