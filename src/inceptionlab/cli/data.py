"""`inceptionlab data ...`: get data sets into the layout the trainers read, and check the user's own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from inceptionlab.cli import options

app = typer.Typer(
    help="Download and prepare data sets (Tiny ImageNet); check a data set's health.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def data() -> None:
    """Download and prepare data sets (Tiny ImageNet); check a data set's health."""


@app.command("check")
def check(
    root: Path = typer.Argument(..., help="The data set's folder: train/ and val/ (test/) of class folders, or one "
                                "folder of class folders."),
    labels: Optional[Path] = typer.Option(None, "--labels", metavar="CSV", help="A labels CSV (file,label[,split]) "
                                          "instead of class folders."),
    workers: Optional[int] = typer.Option(None, "--workers", min=0, help="Processes that read the files "
                                          "(default: this machine's usable CPUs; 0: in this process)."),
    as_json: bool = options.json_option("the splits, counts and every finding with all its files"),
) -> None:
    """Check a data set before training on it: unreadable files, duplicates, leaks, imbalance, odd images.
    It finds files that do not decode, identical and near-identical images (resized or re-encoded
    copies), the same image in train and val (or test), an image under two classes, class counts and
    imbalance (with class weights to use), odd sizes, modes and aspect ratios.
    Each finding names its files and what to do. Exits 1 when it finds errors.

    Examples:

      inceptionlab data check data/flowers

      inceptionlab data check data/photos --labels data/photos/labels.csv --json > check.json
    """
    # start-up time: tqdm and PIL (~0.1 s together) load only when a check runs, not for --help
    from tqdm import tqdm

    from inceptionlab.data.check import check_data
    from inceptionlab.data.check.report import format_report

    bar = tqdm(total=0, unit="file", desc="data check", disable=None, leave=False, dynamic_ncols=True)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    try:
        report = check_data(root, labels, workers, progress)
    finally:
        bar.close()
    typer.echo(json.dumps(report.to_dict()) if as_json else format_report(report))
    if report.counts()["error"]:
        raise typer.Exit(1)


@app.command("tiny-imagenet")
def tiny_imagenet(
    root: Path = typer.Option(
        ..., "--root", help="Folder that contains (or will contain) tiny-imagenet-200/, or that folder itself."),
    archive: Optional[Path] = typer.Option(
        None, "--archive", help="Use this local tiny-imagenet-200.zip instead of downloading it."),
    as_json: bool = options.json_option("the report as one object"),
) -> None:
    """Download/extract Tiny ImageNet and move val images into val/<wnid>/images/ (safe to re-run)."""
    # start-up time: tarfile, ssl and tqdm (~0.1 s), only when the data set is prepared, not for --help
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
