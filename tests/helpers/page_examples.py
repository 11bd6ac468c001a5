"""The example outputs on the docs pages, checked against what the program prints.

A page marks an example output with an HTML comment on the line before its fenced block (invisible on
the site and on GitHub):

    <!-- output: first-steps-predict -->
    ```
    $ inceptionlab predict --run runs/demo/digits/20261122-014848 .../digit_0062.png --topk 3
    ...
    ```

and the test that runs that command on its fixture data (a trained squares run, a tiny ImageFolder)
passes what the command printed to `check_example("first-steps-predict", text)`. The check compares
the block's shape with the program's, not its figures:

- `$ ...` lines (and their `\\` continuations) are the command, not its output, and are left out;
- numbers, class labels, paths and file names, and durations are placeholders on both sides, so a page
  written from a real run on real data matches a test's run on squares; blank lines are ignored;
- every other word must match, line by line, in order: a line the program added, dropped, merged or
  reworded fails the check;
- a page line `...` stands for any number of lines left out, and `...` inside a line for any text;
- a block whose first output line starts with `{` is JSON: the keys and the kinds of values must match
  at every level (lists by their first item); a block that is not valid JSON (abridged with `...`)
  must name only keys the program's answer has.

Labels of the page's own run that are words (tiny-imagenet's `oboe`, `Egyptian cat`) are listed in the
marker: `<!-- output: errors-report; labels: oboe, pretzel, Egyptian cat -->`; the test passes its
run's labels (`labels=["cat", "dog", "fox"]`). A plain, text or console block that shows no output of
the program (a folder layout, a config file, one host's report) says so: `<!-- output: none (why) -->`;
tests/test_docs.py fails on any such block of any page that is neither.

On a mismatch the assertion names the page, the line and the id of the block, and shows both sides
normalised (a diff) and the program's output as printed, to copy into the page.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

MARKER = re.compile(r"^\s*<!-- output: (?P<id>[a-z0-9-]+|none \([^)]*\))(?:; labels: (?P<labels>[^>]*?))? -->\s*$")
FENCE = re.compile(r"^\s*```")
GAP = "..."

NUMBER = re.compile(r"(?<![\w.-])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)*(?:-\d+(?:\.\d+)*)*|\.\d+)(?:e[-+]?\d+)?(?:%|x)?(?![\w])")
PLACEHOLDER = re.compile(r"<[a-z][a-z _-]*>")  # a page's <url>, <pid>: whatever the program prints there
FILE = re.compile(r"(?<![\w/.-])[\w.~-]+\.(?:png|jpe?g|JPE?G|pth|pt|json|jsonl|csv|npy|onnx|html|txt|gz|zip|yaml|pbtxt|xml|bin)\b")
PATH_TOKEN = re.compile(r"[^\s\"'()\[\],;=`]*[A-Za-z<.~][^\s\"'()\[\],;=`]*/[^\s\"'()\[\],;=`]*|"
                        r"[^\s\"'()\[\],;=`]*/[^\s\"'()\[\],;=`]*[A-Za-z>][^\s\"'()\[\],;=`]*")
DURATION = re.compile(r"(?<![\w.])\d+(?:\.\d+)? ?(?:s|ms|min|h)\b")
VALUE = "#"


@dataclass
class Example:
    id: str
    page: Path
    line: int  # of the fence's opening line, 1-based
    lines: list[str]  # the block's lines, the command included
    labels: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)} line {self.line} (<!-- output: {self.id} -->)"

    @property
    def output(self) -> list[str]:
        """The block without its `$ command` lines (and their continuation lines)."""
        out, continued = [], False
        for line in self.lines:
            if continued or line.lstrip().startswith("$ "):
                continued = line.rstrip().endswith("\\")
                continue
            out.append(line)
        return out


def parse_page(page: Path) -> tuple[list[Example], list[tuple[int, str]]]:
    """(the marked blocks, (line, first line) of every unmarked plain fence) of one page."""
    lines = page.read_text().splitlines()
    marked, unmarked = [], []
    i = 0
    while i < len(lines):
        opening = re.match(r"^\s*```(\S*)", lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if FENCE.match(lines[j])), len(lines))
        body = lines[i + 1: end]
        marker = MARKER.match(lines[i - 1]) if i > 0 else None
        if marker:
            labels = [x.strip() for x in (marker["labels"] or "").split(",") if x.strip()]
            marked.append(Example(marker["id"], page, i + 1, body, labels))
        elif opening.group(1) in ("", "text", "console"):
            unmarked.append((i + 1, body[0] if body else ""))
        i = end + 1
    return marked, unmarked


def all_examples() -> list[Example]:
    return [example for page in sorted(DOCS.rglob("*.md")) for example in parse_page(page)[0]]


@lru_cache(maxsize=None)
def _examples_by_id() -> dict[str, Example]:
    return {e.id: e for e in all_examples() if not e.id.startswith("none")}


def example(block_id: str) -> Example:
    found = _examples_by_id().get(block_id)
    assert found is not None, f"no docs page has a block marked <!-- output: {block_id} -->"
    return found


def normalise(line: str, labels: Iterable[str] = ()) -> str:
    """A line's shape: labels, numbers, paths and files become placeholders; spaces collapse."""
    text = PLACEHOLDER.sub("<path>", line.strip())
    text = PATH_TOKEN.sub(lambda m: "<path>" + (m.group()[-1] if m.group()[-1] in ":." else ""), text)
    text = FILE.sub("<path>", text)
    for label in sorted(set(labels), key=len, reverse=True):
        text = re.sub(rf"(?<![\w-]){re.escape(label)}(?![\w-])", VALUE, text)
    text = DURATION.sub("<time>", text)
    text = re.sub(r"#(?:,#)+", VALUE, NUMBER.sub(VALUE, text))  # a list of numbers is one value: 1,2,4,8
    return re.sub(r"\s+", " ", text)


def _pattern(page_line: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in page_line.split(GAP)))


def _matches(patterns: list[re.Pattern[str] | None], lines: list[str]) -> bool:
    """Whether `lines` fit `patterns` in order, a None pattern (a `...` line) taking any number of lines."""
    seen: dict[tuple[int, int], bool] = {}

    def fit(p: int, q: int) -> bool:
        if (p, q) not in seen:
            if p == len(patterns):
                seen[p, q] = q == len(lines)
            elif patterns[p] is None:
                seen[p, q] = any(fit(p + 1, r) for r in range(q, len(lines) + 1))
            else:
                seen[p, q] = q < len(lines) and patterns[p].fullmatch(lines[q]) is not None and fit(p + 1, q + 1)
        return seen[p, q]

    return fit(0, 0)


def _shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    return "number" if isinstance(value, (int, float)) else type(value).__name__


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for item in value.values() for k in _keys(item)}
    if isinstance(value, list):
        return {k for item in value for k in _keys(item)}
    return set()


def check_example(block_id: str, printed: str, labels: Iterable[str] = ()) -> None:
    """Assert that the page's block `block_id` has the shape of `printed`, what the program printed for it."""
    page = example(block_id)
    shown = [line for line in page.output if line.strip()]
    if shown and shown[0].lstrip().startswith(("{", "[")):
        return _check_json(page, "\n".join(shown), printed)
    labels = [*labels, *page.labels]  # either run's labels are labels on both sides
    program = [normalise(line, labels) for line in printed.splitlines() if line.strip()]
    expected = [normalise(line, labels) for line in shown]
    patterns = [None if line == GAP else _pattern(line) for line in expected]
    if _matches(patterns, program):
        return
    diff = "\n".join(difflib.unified_diff(expected, program, "page (normalised)", "program (normalised)", lineterm=""))
    raise AssertionError(
        f"{page.where}: the example no longer matches what the program prints. Numbers, labels, paths and "
        f"times may differ; the lines, their order and their words may not (a page line `...` leaves lines "
        f"out). Update the block.\n{diff}\n--- the program printed:\n{printed.rstrip()}")


def _check_json(page: Example, shown: str, printed: str) -> None:
    answer = json.loads(printed)
    try:
        expected = json.loads(shown)
    except json.JSONDecodeError:  # abridged: every key it names must be one the program answers with
        named = set(re.findall(r'"([^"]+)"\s*:', shown)) - set(page.labels)  # labels: its models' names
        missing = sorted(named - _keys(answer))
        assert not missing, (f"{page.where}: the page names keys the program's answer does not have: {missing}; "
                             f"the program answered:\n{json.dumps(answer, indent=1)[:3000]}")
        return
    if _shape(expected) != _shape(answer):
        diff = "\n".join(difflib.unified_diff(json.dumps(_shape(expected), indent=1).splitlines(),
                                              json.dumps(_shape(answer), indent=1).splitlines(),
                                              "page (keys and kinds)", "program (keys and kinds)", lineterm=""))
        raise AssertionError(f"{page.where}: the example's keys no longer match the program's answer. Update the "
                             f"block.\n{diff}\n--- the program answered:\n{printed.rstrip()}")
