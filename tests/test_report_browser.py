"""The error report in a real headless browser (Debian's chromium + chromium-driver, driven by selenium), used
as a person would: read the figures, click confusion-matrix cells and a confused pair, look at the galleries."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers.small_runs import small_run
from PIL import Image
from test_serve_browser import browser  # noqa: F401  (the fixture: a headless chromium per test)


@pytest.fixture(scope="module")
def report_page(tmp_path_factory):
    """The small run (2 planted label errors in val/) evaluated, and its report with Grad-CAM overlays."""
    pytest.importorskip("captum", reason="Captum is not installed (the trust extra)")
    pytest.importorskip("cleanlab", reason="cleanlab is not installed (the trust extra)")
    from inceptionlab.cli.app import main

    run = small_run(tmp_path_factory).copy(tmp_path_factory.mktemp("report_browser"))
    for args in (["evaluate", str(run.run_dir)], ["report", str(run.run_dir), "--cam", "2", "--device", "cpu"]):
        with pytest.raises(SystemExit) as done:
            main(args)
        assert done.value.code in (0, None), args
    return run, run.run_dir / "eval" / "report.html"


def _cards(page, gallery: str) -> list[dict]:
    """Each card of a gallery as the page shows it: its file name, classes, and whether its pictures loaded."""
    return page.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' .card')].map((c) => ({"
        "  name: c.querySelector('.file').textContent, truth: c.querySelector('.truth').textContent,"
        "  pred: c.querySelector('.pred').textContent, row: +c.dataset.row,"
        "  pictures: [...c.querySelectorAll('img')].map((i) => [i.className, i.complete && i.naturalWidth > 0]),"
        "  note: (c.querySelector('.issue') || {}).textContent || null }));", gallery)


def test_the_report_shows_the_errors_and_a_clicked_cell_shows_its_images(report_page, browser, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By

    run, page = report_page
    browser.set_window_size(1200, 1400)
    browser.get(page.as_uri())
    assert browser.find_element(By.ID, "title").text.startswith("Errors of inception_v3/imagefolder/")
    stats = browser.find_element(By.ID, "summary").text.split("\n")
    assert stats[:4] == ["18", "images", "2", "misclassified"] and "88.9%" in stats

    # The matrix, as read off the page: rows true, columns predicted.
    counts = browser.execute_script(
        "return [...document.querySelectorAll('#matrix tbody tr')].map((tr) =>"
        " [...tr.querySelectorAll('td.cell')].map((td) => +td.textContent));")
    assert counts == [[5, 0, 1], [1, 6, 0], [0, 0, 5]]
    assert not browser.find_element(By.ID, "selection").is_displayed()

    # A person clicks the cell "true cat, predicted fox": the planted fox image, with its Grad-CAM overlay.
    browser.find_element(By.CSS_SELECTOR, '#matrix td[data-true="0"][data-pred="2"]').click()
    assert browser.find_element(By.ID, "selection-title").text == "true cat, predicted fox: 1 image"
    [card] = _cards(browser, "#selection-gallery")
    assert card["name"] == "planted_fox_0.png" and card["truth"] == "cat" and card["pred"] == "fox"
    assert card["pictures"] == [["thumb", True], ["cam", True]]
    browser.save_screenshot(str(tmp_path / "report.png"))

    # Then a diagonal cell: the dog images it got right (its 6, all shown), no Grad-CAM on right answers.
    browser.find_element(By.CSS_SELECTOR, '#matrix td[data-true="1"][data-pred="1"]').click()
    assert browser.find_element(By.ID, "selection-title").text.startswith("dog, predicted correctly: 6 images")
    cards = _cards(browser, "#selection-gallery")
    assert len(cards) == 6 and all(c["truth"] == c["pred"] == "dog" and c["pictures"] == [["thumb", True]] for c in cards)
    selected = browser.find_elements(By.CSS_SELECTOR, "#matrix td.selected")
    assert len(selected) == 1 and selected[0].get_attribute("data-pred") == "1"

    # A most-confused pair leads to the same view as its cell.
    rows = browser.find_elements(By.CSS_SELECTOR, "#pairs-table tbody tr")
    assert [r.text for r in rows] == ["cat fox 1", "dog cat 1"]
    rows[1].click()
    assert browser.find_element(By.ID, "selection-title").text == "true dog, predicted cat: 1 image"
    assert [c["name"] for c in _cards(browser, "#selection-gallery")] == ["planted_cat_0.png"]

    # Per-class precision and recall, worst recall first.
    classes = [r.text.split() for r in browser.find_elements(By.CSS_SELECTOR, "#class-table tbody tr")]
    assert classes == [["cat", "6", "6", "83.3%", "83.3%", "0.833"], ["dog", "7", "6", "100.0%", "85.7%", "0.923"],
                       ["fox", "5", "6", "83.3%", "100.0%", "0.909"]]

    # The galleries: every image drawn, the two wrong ones first by loss, both with overlays.
    losses = _cards(browser, "#loss-gallery")
    assert len(losses) == 18 and all(p[1] for c in losses for p in c["pictures"])
    assert {c["name"] for c in losses[:2]} == {"planted_fox_0.png", "planted_cat_0.png"}
    wrong = _cards(browser, "#wrong-gallery")
    assert [c["name"] for c in wrong] == [c["name"] for c in losses[:2]]
    assert all(c["pictures"] == [["thumb", True], ["cam", True]] for c in wrong)
    issues = _cards(browser, "#issue-gallery")
    assert {(c["name"], c["note"].split(" (")[0]) for c in issues} == {
        ("planted_fox_0.png", "given cat, looks like fox"), ("planted_cat_0.png", "given dog, looks like cat")}
    assert browser.get_log("browser") == []  # no script error, no failed load

    shot = Image.open(tmp_path / "report.png")
    colours = np.unique(np.asarray(shot.convert("RGB").resize((64, 64))).reshape(-1, 3), axis=0)
    assert shot.size[0] >= 1000 and len(colours) > 50  # drawn, not blank


def test_the_report_json_and_the_page_agree(report_page, cli):
    run, page = report_page
    result = cli("report", run.run_dir, "--cam", "0", "--json", "--out", page.with_name("again.html"))
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert Path(summary["report"]).is_file() and summary["misclassified"] == 2
    assert [c["label"] for c in summary["per_class"]] == ["cat", "dog", "fox"]
