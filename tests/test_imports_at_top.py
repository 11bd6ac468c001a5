"""DESIGN.md: imports inside functions are for the start-up time of heavy or optional dependencies only,
each with a comment saying so. Everything else is imported at the top of its module.

An import inside a function (at any depth: under `try`, `if`, in a nested function) passes when it
imports an optional extra (the package is absent without it: the import is the check), or when a
comment explains it: on the statement's own lines, or on the line above the block of consecutive
imports it belongs to (blank lines between its groups, as isort writes them, keep it one block). Lint markers (`# noqa`, `# type: ignore`, `# pragma`) explain nothing.
"""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "inceptionlab"

# The optional extras of pyproject.toml imported on use: without the extra the import fails, so it
# cannot sit at the top of a module that every install imports.
OPTIONAL_EXTRAS = frozenset({
    "onnx", "onnxruntime", "onnxscript",  # onnx / onnx-export
    "openvino", "nncf",  # openvino
    "captum", "cleanlab",  # trust
    "imagehash",  # check
    "sklearn",  # demo
    "timm", "huggingface_hub",  # timm (huggingface_hub: timm's own dependency)
    "grpc", "grpc_tools", "aiohttp", "prometheus_client",  # serve / loadtest / proto
})
LINT_MARKERS = ("noqa", "type:", "pragma", "fmt:", "isort:")


@dataclass(frozen=True)
class LocalImport:
    path: str
    line: int
    modules: tuple[str, ...]
    text: str


def _explaining_comments(source: str) -> dict[int, str]:
    """Line number -> the comment on it, lint markers removed (empty: nothing said)."""
    found: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            text = token.string.lstrip("#").strip()
            words = [part.strip() for part in text.split("#")]
            said = " ".join(w for w in words if w and not w.lower().startswith(LINT_MARKERS))
            found[token.start[0]] = said
    return found


def _imported(node: ast.Import | ast.ImportFrom) -> tuple[str, ...]:
    if isinstance(node, ast.ImportFrom):
        return ("." * node.level + (node.module or ""),)
    return tuple(alias.name for alias in node.names)


def _is_optional_extra(modules: tuple[str, ...]) -> bool:
    return all(not m.startswith(".") and m.split(".")[0] in OPTIONAL_EXTRAS for m in modules)


def _bodies(node: ast.AST):
    """Every statement list under `node` (function bodies, try/if/with/for blocks, handlers)."""
    for field_name in ("body", "orelse", "finalbody"):
        body = getattr(node, field_name, None)
        if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
            yield body
    for handler in getattr(node, "handlers", []):
        yield handler.body
    for case in getattr(node, "cases", []):
        yield case.body


def unexplained_local_imports(source: str, path: str = "<source>") -> list[LocalImport]:
    """The imports inside functions of `source` that are neither an optional extra nor explained."""
    lines = source.splitlines()
    comments = _explaining_comments(source)
    found: list[LocalImport] = []

    def said_on(first: int, last: int) -> bool:
        return any(comments.get(n) for n in range(first, last + 1))

    def heading_comment(line: int) -> bool:
        above = line - 1
        return above >= 1 and lines[above - 1].strip().startswith("#") and bool(comments.get(above))

    def check_body(body: list[ast.stmt], in_function: bool) -> None:
        block_explained = False
        previous: ast.stmt | None = None
        for stmt in body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                continues_block = (isinstance(previous, (ast.Import, ast.ImportFrom)) and not any(
                    lines[n - 1].strip() for n in range((previous.end_lineno or previous.lineno) + 1, stmt.lineno)))
                if not continues_block:
                    block_explained = heading_comment(stmt.lineno)
                modules = _imported(stmt)
                explained = block_explained or said_on(stmt.lineno, stmt.end_lineno or stmt.lineno)
                if in_function and not explained and not _is_optional_extra(modules):
                    found.append(LocalImport(path, stmt.lineno, modules, lines[stmt.lineno - 1].strip()))
            previous = stmt
            walk(stmt, in_function)

    def walk(node: ast.stmt, in_function: bool) -> None:
        inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for body in _bodies(node):
            check_body(body, inside)

    check_body(ast.parse(source).body, False)
    return found


def test_every_import_inside_a_function_is_an_optional_extra_or_says_why():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 100  # the whole package, not an empty glob
    unexplained = [found for path in modules
                   for found in unexplained_local_imports(path.read_text(), str(path.relative_to(PACKAGE)))]
    assert unexplained == [], "import these at the top of the module, or say (in a comment) why not:\n" + \
        "\n".join(f"{u.path}:{u.line}: {u.text}" for u in unexplained)


def test_the_check_flags_a_plain_import_of_the_package_inside_a_function():
    source = ("import os\n\n"
              "def run():\n"
              "    from inceptionlab.fileio import atomic_write_json\n"
              "    return atomic_write_json\n")
    [found] = unexplained_local_imports(source)
    assert (found.line, found.modules) == (4, ("inceptionlab.fileio",))


def test_the_check_flags_imports_nested_in_try_blocks_methods_and_inner_functions():
    source = ("class Server:\n"
              "    def start(self):\n"
              "        try:\n"
              "            import json\n"
              "        except ImportError:\n"
              "            pass\n\n"
              "        def inner():\n"
              "            import torch.distributed\n"
              "        return inner\n")
    assert [f.line for f in unexplained_local_imports(source)] == [4, 9]


def test_a_comment_on_the_line_or_heading_the_block_explains_it_and_lint_markers_do_not():
    source = ("def run():\n"
              "    # start-up time: torch (~1-2 s), only when the command runs\n"
              "    from inceptionlab.infer.bench import run_bench\n"
              "    from inceptionlab.runtime import resolve_device\n\n"
              "    from tqdm import tqdm\n"
              "    x = 1\n"
              "    from inceptionlab.fileio import append_jsonl\n"
              "    from inceptionlab.plots import plot_run  # matplotlib (~0.4 s): only when drawing\n"
              "    from inceptionlab.errors import UserError  # noqa: F401\n"
              "    import tqdm  # type: ignore[import]\n")
    assert [f.line for f in unexplained_local_imports(source)] == [8, 10, 11]


def test_optional_extras_pass_without_a_comment_and_module_level_imports_are_not_checked():
    source = ("try:\n"
              "    import onnx\n"
              "except ImportError:\n"
              "    onnx = None\n"
              "import json\n\n"
              "def run():\n"
              "    import onnxruntime\n"
              "    import openvino as ov\n"
              "    from onnxruntime.quantization import quantize_static\n"
              "    from matplotlib import colormaps\n")
    assert [f.line for f in unexplained_local_imports(source)] == [11]
