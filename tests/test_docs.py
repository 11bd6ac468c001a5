"""The docs site builds offline in strict mode, its CLI reference is the program's own help, and the
benchmark result files round-trip into the performance tables."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
mkdocs_config = pytest.importorskip("mkdocs.config", reason="mkdocs is in the docs extra (part of the test extra)")


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = load_module(REPO / "docs" / "hooks" / "generated.py", "docs_hooks_generated")
results = load_module(REPO / "benchmarks" / "_results.py", "benchmark_results")


def refuse_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a connection fails the test: the build must work offline."""
    def refuse(self, address):
        raise AssertionError(f"the docs build tried to connect to {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")  # Material's end-of-life banner


def build_site(config_file: Path, site: Path) -> None:
    """`mkdocs build --strict`, in this process so that the network can be refused."""
    from mkdocs.commands.build import build

    with pytest.MonkeyPatch.context() as monkeypatch:
        refuse_network(monkeypatch)
        build(mkdocs_config.load_config(config_file=str(config_file), site_dir=str(site), strict=True))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("docs") / "site"
    build_site(REPO / "mkdocs.yml", folder)
    return folder


def command_paths() -> list[tuple[list[str], object]]:
    import typer.main

    return [(path, command) for path, command, _ in hooks.walk(typer.main.get_command(hooks.typer_app()), ["inceptionlab"])]


def test_the_site_builds_in_strict_mode_offline_with_every_page(site):
    pages = {p.relative_to(REPO / "docs").with_suffix("") for p in (REPO / "docs").rglob("*.md")}
    built = {p.relative_to(site).parent for p in site.rglob("index.html")}
    assert {Path(".") if p.name == "index" else p for p in pages} <= built
    html = "\n".join(p.read_text() for p in site.rglob("*.html"))
    assert "fonts.googleapis.com" not in html and "fonts.gstatic.com" not in html
    assert "<!-- cli-reference -->" not in html and "<!-- results:" not in html  # every marker expanded


def test_a_broken_link_fails_the_build(tmp_path):
    from mkdocs.exceptions import Abort

    for name in ("docs", "mkdocs.yml", "benchmarks/_results.py"):
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, target)
    with open(tmp_path / "docs" / "index.md", "a") as page:
        page.write("\n[a page that does not exist](no-such-page.md)\n")

    with pytest.raises(Abort):
        build_site(tmp_path / "mkdocs.yml", tmp_path / "site")


def test_the_cli_reference_holds_every_command_and_option():
    reference = hooks.cli_reference(hooks.typer_app())
    sections = dict(re.findall(r"^## (.+?)\n\n```text\n(.*?)\n```", reference, flags=re.S | re.M))

    paths = command_paths()
    assert {" ".join(path) for path, _ in paths} == set(sections)
    assert "inceptionlab data tiny-imagenet" in sections  # a nested group's command is reached too
    for path, command in paths:
        text = sections[" ".join(path)]
        assert text.startswith(f"Usage: {' '.join(path)} ")
        assert "╭" not in text  # plain text, not Rich's boxes
        for param in command.params:
            for option in param.opts if param.param_type_name == "option" else []:
                assert option in text, f"{' '.join(path)}: {option} missing from its reference"


def test_the_cli_page_is_the_generated_reference(site):
    page = (site / "cli" / "index.html").read_text()

    for path, _ in command_paths():
        assert f"Usage: {' '.join(path)} " in page


def test_the_cli_pages_table_of_commands_is_the_programs():
    """docs/cli.md is read in the repository too (the full reference exists only in the built site): its
    table of commands is written from the program, and must be rewritten when a command changes."""
    page = (REPO / "docs" / "cli.md").read_text()
    current = hooks.with_command_table(page, hooks.command_table(hooks.typer_app()))
    assert page == current, "docs/cli.md's table of commands is out of date: run `python docs/hooks/generated.py`"
    listed = re.findall(r"^\| `(inceptionlab [a-z -]+)` \|", page, flags=re.M)
    assert set(listed) == {" ".join(path) for path, command in command_paths()
                           if len(path) > 1 and not hasattr(command, "list_commands")}


FAKE_ENV = {"device": "cpu", "device_name": "Test(R) CPU 9000", "cpu": "Test(R) CPU 9000", "cpu_capability": "AVX2",
            "cpu_count": 2, "torch_threads": 2, "versions": {"torch": "9.9"}, "time": "2030-01-01T00:00:00",
            "load_average": 0.5}
COLUMNS = [("config", "configuration"), ("img_per_s", "img/s", ".1f"), ("agreement", "agreement")]


def test_write_result_writes_rows_columns_command_and_environment(tmp_path):
    path = results.write_result("train_throughput", [{"config": "plain", "img_per_s": 3.7615}], title="a step",
                                columns=COLUMNS, settings={"batch": 16}, folder=tmp_path, env=FAKE_ENV)

    # The capability is part of the machine's name: "AMD EPYC" alone is both a Zen 3 and a Zen 4 VM.
    assert re.fullmatch(r"train_throughput--test-cpu-9000-avx2--\d{8}-\d{6}\.json", path.name)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # written atomically: no temp file left
    with_bf16 = {**FAKE_ENV, "cpu_capability": "AVX512", "cpu_bf16": True}
    assert results.machine_slug(with_bf16) == "test-cpu-9000-avx512-bf16" != results.machine_slug(FAKE_ENV)
    # A CPU with bf16 units measured with its ISA capped (the AVX2-only stand-in) is not that CPU.
    capped = {**FAKE_ENV, "speed_env": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}
    assert results.machine_slug(capped) == "test-cpu-9000-avx2-isa-capped"
    assert "no bf16 units, ISA capped to AVX2 by ONEDNN_MAX_CPU_ISA" in results.machine_line(capped)
    record = json.loads(path.read_text())
    assert record["rows"] == [{"config": "plain", "img_per_s": 3.7615}]
    assert record["env"] == FAKE_ENV and record["settings"] == {"batch": 16} and record["title"] == "a step"
    assert record["columns"] == [list(c) for c in COLUMNS]
    assert record["command"].startswith("python ")


def test_details_never_replace_the_records_own_fields(tmp_path):
    """bench_repeat passed details={"rows": ...}: the per-call rows replaced the table's rows and the docs'
    renderer then failed on the file (AttributeError: 'list' object has no attribute 'get')."""
    with pytest.raises(ValueError, match="rows"):
        results.write_result("bench_repeat", [{"call": "repetition 1"}], title="t", columns=COLUMNS, settings={},
                             env=FAKE_ENV, folder=tmp_path, details={"rows": [[{"backend": "eager"}]]})
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_write_result_records_this_machines_environment(tmp_path):
    path = results.write_result("bench", [], title="t", columns=COLUMNS, settings={}, folder=tmp_path)

    env = json.loads(path.read_text())["env"]
    from inceptionlab.runtime import environment

    assert set(env) == set(environment("cpu"))  # the one environment record, as env.json has it
    assert path.name.startswith(f"bench--{results.machine_slug(env)}--")


def result_file(folder: Path, benchmark: str, machine: str, stamp: str, rows: list[dict]) -> None:
    env = {**FAKE_ENV, "device_name": machine, "cpu": machine}
    record = {"schema": results.SCHEMA, "benchmark": benchmark, "title": f"{benchmark} title",
              "command": f"python benchmarks/{benchmark}.py", "settings": {}, "columns": [list(c) for c in COLUMNS],
              "rows": rows, "env": env}
    (folder / f"{benchmark}--{results.machine_slug(env)}--{stamp}.json").write_text(json.dumps(record))


def test_render_draws_the_newest_table_per_machine_each_naming_its_machine(tmp_path):
    result_file(tmp_path, "inference", "AMD EPYC 7763", "20300101-000000", [{"config": "old", "img_per_s": 1.0}])
    result_file(tmp_path, "inference", "AMD EPYC 7763", "20300102-000000",
                [{"config": "eager", "img_per_s": 11.44, "agreement": None}])
    result_file(tmp_path, "inference", "Intel(R) Xeon(R) Platinum 8480+", "20300101-000000",
                [{"config": "openvino", "img_per_s": 177.81, "agreement": True}])
    result_file(tmp_path, "serve", "AMD EPYC 7763", "20300101-000000", [{"config": "unbatched", "img_per_s": 2.0}])
    (tmp_path / "README.md").write_text("not a result")

    text = results.render_benchmark("inference", tmp_path)

    assert "**AMD EPYC 7763 (AVX2, no bf16 units, 2 cores, 2 torch threads)**: inference title" in text
    assert "**Intel(R) Xeon(R) Platinum 8480+ (AVX2" in text
    assert "| eager | 11.4 | - |" in text and "| openvino | 177.8 | yes |" in text
    assert "| old |" not in text and "unbatched" not in text  # an older file and another benchmark
    assert "|---|---:|---|" in text  # formatted columns right-aligned
    assert "`python benchmarks/inference.py`" in text and "torch 9.9" in text


def test_render_says_plainly_when_there_are_no_results(tmp_path):
    text = results.render_benchmark("inference", tmp_path)

    assert text.startswith("*No results yet.*") and "python benchmarks/inference.py" in text


def test_render_refuses_a_result_file_of_another_schema(tmp_path):
    (tmp_path / "inference--cpu--20300101-000000.json").write_text(json.dumps({"schema": 99}))

    with pytest.raises(ValueError, match="inference--cpu--20300101-000000.json: result schema 99"):
        results.render_benchmark("inference", tmp_path)


def test_every_benchmark_that_writes_results_has_a_table_on_the_performance_page():
    written = {m for script in (REPO / "benchmarks").glob("*.py")
               for m in re.findall(r'write_result\(\s*"([a-z0-9_]+)"', script.read_text())}
    shown = set(re.findall(r"<!-- results: ([a-z0-9_]+) -->", (REPO / "docs" / "performance.md").read_text()))

    assert written == shown
    assert all((REPO / "benchmarks" / f"{name}.py").exists() for name in shown)


def heading_anchors(page: Path) -> set[str]:
    """The ids Python-Markdown's toc (MkDocs) gives a page's headings; GitHub's differ only in cases unused here."""
    from markdown.extensions.toc import slugify

    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", page.read_text(), flags=re.S), flags=re.M)
    explicit = [re.search(r"\{#([\w-]+)\}\s*$", heading) for heading in headings]  # attr_list's {#id}
    return {found[1] if found else slugify(re.sub(r"[`*]", "", heading), "-")
            for heading, found in zip(headings, explicit)}


def test_the_readme_links_only_to_pages_and_headings_that_exist():
    """The README is not part of the site, so the strict build does not check its links: this does."""
    readme = (REPO / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", readme) if not re.match(r"[a-z]+:", t)]

    assert len(targets) > 10  # the README is a landing page: it links into the docs
    for target in targets:
        path, _, anchor = target.partition("#")
        assert (REPO / path).is_file(), f"README links to {target}: no such file"
        if anchor:
            assert anchor in heading_anchors(REPO / path), f"README links to {target}: no such heading"


def test_fast_inferences_agreement_table_is_its_result_file():
    """The page's table of top-1 agreement with fp32 is the result file it names, row for row (it said 99.3%
    and usable for int8 where the file measured 98.0% and 97.0%, refused)."""
    page = (REPO / "docs" / "fast-inference.md").read_text()
    [name] = re.findall(r"`benchmarks/results/(inference--[^`]+\.json)`", page)
    record = json.loads((REPO / "benchmarks" / "results" / name).read_text())
    judged = [row for row in record["rows"] if row.get("agreement") is not None]
    configs = sorted({(row["backend"], row["precision"]) for row in judged})
    lines = ["| configuration | top-1 agreement with fp32 | usable |", "|---|---:|---|"]
    for backend, precision in configs:
        rows = [row for row in judged if (row["backend"], row["precision"]) == (backend, precision)]
        assert len({(row["agreement"], row["agreement_images"], row["usable"]) for row in rows}) == 1  # batch 1 = 8
        row = rows[0]
        lines.append(f"| {backend} {precision} | {row['agreement']:.1%} (n={row['agreement_images']}) | "
                     f"{'yes' if row['usable'] else 'no'} |")
    assert "\n".join(lines) in page, "\n".join(lines)


def test_a_benchmark_run_writes_a_result_the_performance_page_renders(tmp_path):
    """The smallest run of a real benchmark script: its file carries rows and machine, and renders."""
    env = {**os.environ, results.RESULTS_ENV: str(tmp_path), "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "train_throughput.py"), "--size", "75", "--batch", "2",
                    "--steps", "1", "--warmup", "1", "--configs", "plain"], env=env, check=True, capture_output=True,
                   timeout=240)

    (path,) = tmp_path.glob("train_throughput--*.json")
    record = json.loads(path.read_text())
    assert [row["config"] for row in record["rows"]] == ["plain"] and record["rows"][0]["img_per_s"] > 0
    assert record["env"]["cpu"] and record["env"]["versions"]["torch"]
    table = results.render_benchmark("train_throughput", tmp_path)
    assert f"**{record['env']['cpu']} (" in table and "| plain | fp32 |" in table


# ---------------------------------------------------------------- example outputs on the pages (helpers/page_examples.py)

def test_every_example_output_on_every_page_is_marked():
    """Every plain, text or console block on every page (docs/*.md, docs/serving/*.md) is an example output
    checked against the program (<!-- output: ID --> and check_example("ID", ...) in a test), or says why it
    is not one (<!-- output: none (why) -->: a folder layout, a config file, output only a GPU host prints)."""
    from helpers.page_examples import parse_page

    pages = sorted((REPO / "docs").rglob("*.md"))
    assert {p.relative_to(REPO / "docs").parts[0] for p in pages} >= {"first-steps.md", "serving"}
    unmarked = {str(page.relative_to(REPO)): [line for line, _ in parse_page(page)[1]] for page in pages}
    unmarked = {page: lines for page, lines in unmarked.items() if lines}
    assert not unmarked, ("blocks without <!-- output: ID --> (the id of a check in the tests, see tests/helpers/"
                          f"page_examples.py) or <!-- output: none (why) -->, by page and line: {unmarked}")


def test_every_marked_example_is_checked_by_a_test_and_ids_are_unique():
    """A block is checked where a test runs its command (check_example("ID", output)): each id must be named
    by some test file, so a marked block cannot go unchecked."""
    from helpers.page_examples import all_examples

    examples = [e for e in all_examples() if not e.id.startswith("none")]
    ids = [e.id for e in examples]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    tests = "\n".join(p.read_text() for p in (REPO / "tests").rglob("*.py") if p.name != "page_examples.py")
    named = set(re.findall(r"""check_example\(\s*["']([a-z0-9-]+)["']""", tests))
    assert not set(ids) - named, f"marked on a page but checked by no test: {sorted(set(ids) - named)}"
    assert not named - set(ids), f"checked by a test but marked on no page: {sorted(named - set(ids))}"


def test_the_example_check_ignores_figures_but_not_lines_or_words(tmp_path, monkeypatch):
    from helpers import page_examples

    page = tmp_path / "page.md"
    page.write_text("# A page\n\n<!-- output: a-run -->\n```\n$ inceptionlab evaluate runs/x/20261122-014848 \\\n"
                    "    --json\nscored runs/x/model.pt: the weights training ended with\n...\n"
                    "359 samples  loss 0.2661  top-1 0.9248 (in 2.5 s)\nwrote ..., plots/confusion.png\n```\n\n"
                    "<!-- output: a-reply -->\n```\n$ curl ...\n"
                    '{"model": "tiny", "results": [{"file": "body", "topk": [{"label": "dog", "prob": 0.9}]}]}\n```\n')
    monkeypatch.setattr(page_examples, "DOCS", tmp_path)
    monkeypatch.setattr(page_examples, "REPO", tmp_path)
    page_examples._examples_by_id.cache_clear()
    check = page_examples.check_example  # (by another name: these ids are of this page, not the docs')
    try:
        printed = ("scored /tmp/r/model.pt: the weights training ended with\nclass n accuracy\ncat 3 1.000\n\n"
                   "9 samples  loss 0.5  top-1 1.0 (in 41 ms)\nwrote /tmp/r/eval/eval.json, /tmp/r/eval/plots/confusion.png\n")
        check("a-run", printed)
        with pytest.raises(AssertionError, match=r"page\.md line 4 \(<!-- output: a-run -->\)") as caught:
            check("a-run", printed.replace("samples", "images"))
        assert "+# images loss # top-1 # (in <time>)" in str(caught.value)  # the diff shows the program's line
        with pytest.raises(AssertionError, match="no longer matches"):
            check("a-run", printed + "decision rule saved to /tmp/r/spec.json\n")
        check("a-reply", '{"model": "x", "results": [{"file": "f", "topk": [{"label": "cat", '
                                                '"prob": 1}, {"label": "dog", "prob": 0}]}]}')
        with pytest.raises(AssertionError, match="keys no longer match"):
            check("a-reply", '{"model": "x", "results": [{"file": "f", "topk": [], "answer": "cat"}]}')
    finally:
        page_examples._examples_by_id.cache_clear()
