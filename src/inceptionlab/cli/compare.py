"""`inceptionlab compare`: two evaluations of the same images, and whether the difference is more than chance."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from inceptionlab.cli import options
from inceptionlab.cli.text import display_width, pad

EVALUATION = "A run directory (its eval/ folder) or a folder evaluate wrote with --out."


def compare(
    a: Path = typer.Argument(..., metavar="A", help=EVALUATION, show_default=False),
    b: Path = typer.Argument(..., metavar="B", help=EVALUATION, show_default=False),
    show: int = typer.Option(5, "--show", min=0, help="Images to name of each kind: B right where A is wrong, "
                             "and the other way."),
    classes: int = typer.Option(15, "--classes", min=0, help="Classes in the table, largest change of recall first."),
    as_json: bool = options.json_option(
        "a, b, samples (images both scored), only_in_a, only_in_b, top1_a, top1_b, difference (B - A), ci95, "
        "b_right_a_wrong and a_right_b_wrong (files), p_value (McNemar's exact test), verdict, per_class "
        "(label, n, recall_a, recall_b, change)"),
) -> None:
    """Compare two evaluations image by image: is B better than A, or could the difference be chance?
    Pairs the images both scored, counts those only one of them gets right, and judges the split with
    McNemar's exact test; per-class recall shows where they differ. Evaluate both runs first.

    Examples:

      inceptionlab compare runs/inception_v3/imagefolder/20261127-101500 runs/inception_v3/imagefolder/20261127-141500

      inceptionlab compare RUN_A RUN_B --json | jq .p_value
    """
    # start-up time: torch (~1-2 s) loads when the command runs, never for `inceptionlab --help`
    from inceptionlab.judge.compare import compare as compare_results
    from inceptionlab.judge.compare import stale_note
    from inceptionlab.judge.results import read_results

    tables = read_results(a), read_results(b)
    for note in filter(None, map(stale_note, tables)):
        typer.echo(f"warning: {note}", err=True)
    result = compare_results(*tables)
    if as_json:
        print(json.dumps(result))
        return
    _print(result, show, classes)


def _print(result: dict, show: int, classes: int) -> None:
    print(f"A: {result['a']}\nB: {result['b']}")
    apart = [f"{result[key]} only in {side}" for key, side in (("only_in_a", "A"), ("only_in_b", "B")) if result[key]]
    print(f"{result['samples']} images scored by both" + (f" ({', '.join(apart)}: left out)" if apart else ""))
    low, high = result["ci95"]
    print(f"top-1  A {result['top1_a']:.4f}  B {result['top1_b']:.4f}  B - A {result['difference']:+.4f} "
          f"(95% interval {low:+.4f} to {high:+.4f})")
    for key, what in (("b_right_a_wrong", "B right, A wrong"), ("a_right_b_wrong", "A right, B wrong")):
        files = result[key]
        named = f": {', '.join(files[:show])}" + (" ..." if len(files) > show else "") if show and files else ""
        print(f"  {what}: {len(files)} image(s){named}")
    print(result["verdict"])
    table = result["per_class"][:classes]
    if table:
        width = max([display_width(row["label"]) for row in table] + [5])
        more = len(result["per_class"]) - len(table)
        print(f"\n{pad('class', width)}  {'n':>5}  {'A':>6}  {'B':>6}  change"
              + (f"   (largest {len(table)} of {len(table) + more})" if more else ""))
        for row in table:
            print(f"{pad(row['label'], width)}  {row['n']:>5}  {row['recall_a']:6.3f}  {row['recall_b']:6.3f}  "
                  f"{row['change']:+.3f}")


def register(root: typer.Typer) -> None:
    root.command("compare")(compare)
