"""Print the Markdown tables the docs draw from benchmarks/results/ (the same renderer the MkDocs hook calls).

    python benchmarks/render_results.py                      # every benchmark that has a result
    python benchmarks/render_results.py train_throughput --results /tmp/trial
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _results import read_results, render_benchmark, results_folder  # this folder's sibling module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmarks", nargs="*", help="benchmark names (default: all with a result file)")
    parser.add_argument("--results", type=Path, default=None, help="results folder (default: benchmarks/results)")
    args = parser.parse_args()
    folder = args.results or results_folder()
    names = args.benchmarks or sorted({record["benchmark"] for record in read_results(folder)})
    for name in names:
        print(f"## {name}\n\n{render_benchmark(name, folder)}\n")
    if not names:
        print(f"no result files in {folder}")


if __name__ == "__main__":
    main()
