"""Keep the code runnable on the GPU image's torch and torchvision (tools/gpu_image.toml: 2.11 / 0.26).

CI installs a newer torch; the GPU machine has torch 2.11.0 and torchvision 0.26.0 and no network, so a
use of an API that appeared later would first fail there, after its minutes were spent. Installing the
old pair in CI costs several GB; instead:

- `scan` reads the project's Python files (src/, benchmarks/, tests/, tools/) with `ast` and lists
  every attribute chain rooted at an import of torch or torchvision (`torch.cuda.set_sync_debug_mode`,
  `F.interpolate` with `import torch.nn.functional as F`, `from torch.utils.data import DataLoader`);
- `generate`, run once in a venv with the image's torch and torchvision, records the names each step
  of those chains can take there (tools/torch_api.json: the public names of every torch/torchvision
  module loaded, and of each class or object a chain walks through);
- tests/test_torch_api.py checks, in every CI run and in well under a second, that each chain of
  today's code walks through names that the record says exist.

Limits: calls on values (`x.foo()` where x is a tensor) and keyword arguments are not seen, only chains
that start at the module. A chain whose last name the same file tests with hasattr/getattr (a guarded
use, for newer releases) is allowed. When the code reaches a module or class the record has not seen,
the test says so and names the command that refreshes the record:

    python -m venv /tmp/venv-t211 && /tmp/venv-t211/bin/pip install torch==2.11.0 torchvision==0.26.0
    /tmp/venv-t211/bin/python tools/torch_api.py generate     # writes tools/torch_api.json
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import sys
import types
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "tools" / "torch_api.json"
ROOTS = ("torch", "torchvision")
SCANNED = ("src", "benchmarks", "tests", "tools")
# Recorded whether or not the code walks through them yet: objects that are not modules (so the module
# sweep misses them) and that GPU work reaches for, such as the fp32_precision settings of torch >= 2.9.
ALSO_RECORDED = ("torch.Tensor", "torch.nn.Module", "torch.backends", "torch.backends.cuda.matmul",
                 "torch.backends.cudnn.conv", "torch.backends.cudnn.rnn", "torch.backends.mkldnn.matmul",
                 "torch.backends.mkldnn.conv", "torch.backends.mkldnn.rnn", "torch._dynamo", "torch._dynamo.config",
                 "torch._inductor", "torch._inductor.config", "torch.compiler", "torch.amp", "torch.cuda.amp",
                 "torch.accelerator", "torch.cuda.memory", "torch.cuda.graphs", "torch.utils.data.DataLoader",
                 "torch.distributed.checkpoint", "torch.export", "torch.onnx")
# Settings objects answer names through __getattr__ that dir() does not list (torch 2.11's
# torch.backends.cudnn.conv lists only 'backend' and 'op'): these are tried on each such object.
PROBED = ("fp32_precision", "allow_tf32", "allow_fp16_reduced_precision_reduction",
          "allow_bf16_reduced_precision_reduction", "allow_fp16_accumulation", "benchmark", "benchmark_limit",
          "deterministic", "enabled", "verbose", "cufft_plan_cache", "preferred_linalg_library",
          "preferred_blas_library",
          "math_sdp_enabled", "flash_sdp_enabled", "mem_efficient_sdp_enabled", "cudnn_sdp_enabled",
          "patch", "recompile_limit")  # torch config modules answer these through __getattr__ too


@dataclass(frozen=True)
class Use:
    chain: str  # "torch.cuda.set_sync_debug_mode"
    where: str  # "src/inceptionlab/hardware.py:120"


# --------------------------------------------------------------------------- scan


def python_files(repo: Path = REPO) -> list[Path]:
    return sorted(path for folder in SCANNED for path in (repo / folder).rglob("*.py"))


def scan_file(path: Path, repo: Path = REPO) -> tuple[list[Use], set[str]]:
    """(the chains rooted at torch/torchvision in this file, the attribute names it tests with
    hasattr/getattr)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    where = lambda node: f"{path.relative_to(repo)}:{node.lineno}"  # noqa: E731
    aliases: dict[str, str] = {}
    uses: list[Use] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ROOTS:
                    uses.append(Use(alias.name, where(node)))
                    if alias.asname:
                        aliases[alias.asname] = alias.name
                    else:
                        aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.split(".")[0] in ROOTS:
                for alias in node.names:
                    if alias.name != "*":
                        uses.append(Use(f"{node.module}.{alias.name}", where(node)))
                        aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    uses += _attribute_chains(tree, aliases, where)
    return uses, _guarded_names(tree)


def _attribute_chains(tree: ast.AST, aliases: dict[str, str], where) -> list[Use]:
    found: list[Use] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Attribute):
            parts = _dotted(node)
            if parts and parts[0] in aliases:
                found.append(Use(".".join([aliases[parts[0]], *parts[1:]]), where(node)))
                return  # its inner attributes are prefixes of this chain
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _guarded_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)):
            names.add(node.args[1].value)
    return names


def scan(files: Iterable[Path], repo: Path = REPO) -> tuple[list[Use], dict[str, set[str]]]:
    """Every use in `files`, and per file the names it guards."""
    uses, guarded = [], {}
    for path in files:
        found, names = scan_file(path, repo)
        uses += found
        guarded[str(path.relative_to(repo))] = names
    return uses, guarded


# --------------------------------------------------------------------------- check


@dataclass(frozen=True)
class Problem:
    use: Use
    reason: str

    def __str__(self) -> str:
        return f"{self.use.where}: {self.use.chain}: {self.reason}"


def check(uses: Iterable[Use], guarded: dict[str, set[str]], record: dict) -> list[Problem]:
    """The uses whose chain takes a step that the record says does not exist, or has not seen."""
    names = {prefix: set(listed) for prefix, listed in record["names"].items()}
    dynamic = set(record.get("dynamic", ()))
    versions = f"torch {record['torch']} / torchvision {record['torchvision']}"
    problems = []
    for use in uses:
        parts = use.chain.split(".")
        for i in range(1, len(parts)):
            prefix, name = ".".join(parts[:i]), parts[i]
            if prefix not in names:
                problems.append(Problem(use, f"{prefix} is not in the record of {versions}: refresh it "
                                             "(`python tools/torch_api.py generate` in a venv with those versions)"))
                break
            if name not in names[prefix]:
                if name not in guarded.get(use.where.rsplit(":", 1)[0], set()):
                    problems.append(Problem(use, _absent(prefix, name, versions, prefix in dynamic)))
                break
    return problems


def _absent(prefix: str, name: str, versions: str, dynamic: bool) -> str:
    if dynamic:  # its names come from __getattr__: the record holds only those tried
        return (f"{prefix} answered no {name!r} when the record of {versions} was made (it looks names up "
                "on use: if those versions have it, add it to PROBED in tools/torch_api.py and refresh the record)")
    return f"{prefix} has no {name!r} in {versions} (the GPU image's): use what both have, or guard it with hasattr"


# --------------------------------------------------------------------------- generate (in a torch 2.11 venv)


def generate(uses: Iterable[Use]) -> dict:
    """The names each step of `uses` can take in the installed torch/torchvision, plus every public
    torch/torchvision module's public names, so that most new uses need no refresh."""
    import torch
    import torchvision

    used: dict[str, set[str]] = {}
    for use in uses:
        parts = use.chain.split(".")
        for i in range(1, len(parts)):
            used.setdefault(".".join(parts[:i]), set()).add(parts[i])
    for prefix in ALSO_RECORDED:
        used.setdefault(prefix, set())
    names: dict[str, set[str]] = {}
    dynamic = []
    for prefix in sorted(used, key=lambda p: p.count(".")):
        obj = _resolve(prefix)
        if obj is _MISSING:
            continue
        names[prefix] = _names_of(obj, used[prefix])
        if _answers_more_than_dir(obj):
            dynamic.append(prefix)
            names[prefix] |= {name for name in PROBED if _has(obj, name)}
    for module_name, module in list(sys.modules.items()):
        if module_name.split(".")[0] in ROOTS and isinstance(module, types.ModuleType) and not any(
                part.startswith("_") for part in module_name.split(".")):
            names.setdefault(module_name, set()).update(_names_of(module, used.get(module_name, set())))
    return {"torch": torch.__version__.split("+")[0], "torchvision": torchvision.__version__.split("+")[0],
            "python": ".".join(map(str, sys.version_info[:3])),
            "dynamic": sorted(dynamic), "names": {prefix: sorted(listed) for prefix, listed in sorted(names.items())}}


def _has(obj: object, name: str) -> bool:
    try:
        getattr(obj, name)
    except Exception:  # a probe: only a name that answers counts
        return False
    return True


def _answers_more_than_dir(obj: object) -> bool:
    """A class-defined __getattr__ (not a module's): names may exist that dir() does not list."""
    return not isinstance(obj, type) and "__getattr__" in {name for klass in type(obj).__mro__[:-1]
                                                             for name in vars(klass)}


_MISSING = object()


def _resolve(dotted: str) -> object:
    """The object at a dotted path, importing submodules as `import a.b.c` would."""
    parts = dotted.split(".")
    obj: object = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            try:
                obj = importlib.import_module(".".join(parts[: i + 1]))
            except ImportError:
                return _MISSING
    return obj


def _names_of(obj: object, used: set[str]) -> set[str]:
    """Public names of `obj`, and the private ones the code uses, that exist on it (or import from it)."""
    present = {name for name in dir(obj) if not name.startswith("_")}
    for name in used:
        if name in present:
            continue
        try:
            getattr(obj, name)
            present.add(name)
        except AttributeError:
            if isinstance(obj, types.ModuleType):
                try:
                    importlib.import_module(f"{obj.__name__}.{name}")
                    present.add(name)
                except ImportError:
                    pass
        except Exception:  # a lazy attribute that fails to build still exists as a name
            present.add(name)
    return present


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["scan", "check", "generate"])
    parser.add_argument("--record", type=Path, default=RECORD)
    args = parser.parse_args(argv)
    uses, guarded = scan(python_files())
    if args.command == "scan":
        for use in sorted(uses, key=lambda u: u.chain):
            print(f"{use.chain}  {use.where}")
        return 0
    if args.command == "generate":
        record = generate(uses)
        args.record.write_text(json.dumps(record, indent=0, sort_keys=True) + "\n")
        print(f"{args.record}: torch {record['torch']}, torchvision {record['torchvision']}, "
              f"{len(record['names'])} namespaces", file=sys.stderr)
        return 0
    problems = check(uses, guarded, json.loads(args.record.read_text()))
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
