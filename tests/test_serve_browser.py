"""The page at / in a real headless browser (Debian's chromium + chromium-driver, driven by selenium)."""

from __future__ import annotations

import shutil

import pytest
import torch
from serve_helpers import classify_over_both, serve_model, train_tiny_run, uvicorn_thread

from inceptionlab.infer.predict import Predictor
from inceptionlab.models.registry import load_run_model
from inceptionlab.serve.app import create_app
from inceptionlab.serve.service import RequestSettings

CHROME_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run")


def chromium_paths() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip("no headless browser: install Debian's chromium and chromium-driver "
                    "(apt-get install -y chromium chromium-driver; .ci/run does it in CI)")
    return browser, driver


@pytest.fixture
def browser(tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra)")
    from selenium.webdriver.chrome.service import Service

    binary, driver = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (*CHROME_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    chrome.set_page_load_timeout(60)
    try:
        yield chrome
    finally:
        chrome.quit()


def test_page_loads_and_an_upload_shows_the_right_top_label(tmp_path_factory, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    run_dir, data = train_tiny_run(tmp_path_factory)
    net, spec = load_run_model(run_dir)
    predictor = Predictor(net, spec, torch.device("cpu"))
    files = sorted((data / "val").rglob("*.png"))
    # The label `predict` gives an image whose folder agrees (the tiny model is not perfect on every one).
    image, expected = next((f, r["topk"][0]["label"]) for f, r in zip(files, predictor.predict_files(files))
                           if r["topk"][0]["label"] == f.parent.name)
    with uvicorn_thread(create_app([serve_model(run_dir)], RequestSettings())) as base:
        browser.get(base + "/")
        wait = WebDriverWait(browser, 30)
        wait.until(ready.text_to_be_present_in_element((By.ID, "info"), "3 classes"))
        assert browser.find_element(By.ID, "image-ui").is_displayed()
        browser.find_element(By.ID, "files").send_keys(str(image))
        wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, "#results .row")))
        rows = browser.find_elements(By.CSS_SELECTOR, "#results .row .label")
        assert rows[0].text == expected and len(rows) == 3  # top-k of a 3-class model
        assert browser.find_element(By.CSS_SELECTOR, "#results b").text == image.name
        assert "ms on the server" in browser.find_element(By.ID, "time").text


LIVE_ROW = '#live tr[data-model="tiny"][data-protocol="{}"]'


def _live_row(browser, protocol: str) -> dict[str, str] | None:
    """One row of the page's live table, read in one go (the page redraws it every second)."""
    return browser.execute_script(
        "const row = document.querySelector(arguments[0]);"
        "return row ? Object.fromEntries([...row.cells].map((c) => [c.className, c.textContent])) : null;",
        LIVE_ROW.format(protocol))


def test_the_page_shows_the_server_at_work_per_protocol(tmp_path_factory, browser):
    """Requests sent over HTTP and gRPC appear on the page, each under its protocol, from the server's metrics."""
    from selenium.webdriver.support.ui import WebDriverWait

    run_dir, data = train_tiny_run(tmp_path_factory)
    image = sorted((data / "val").rglob("*.png"))[0].read_bytes()
    app = create_app([serve_model(run_dir)], RequestSettings(max_delay_ms=20), grpc_address="127.0.0.1:0")
    with uvicorn_thread(app) as base:
        browser.get(base + "/")
        wait = WebDriverWait(browser, 30)
        before = wait.until(lambda b: (row := _live_row(b, "http")) and _live_row(b, "grpc") and row)
        assert before["requests"] == "0" and before["rate"] in ("0.0", "-") and before["p50"] == "-"
        classify_over_both(base, app.state.serve.grpc_port, image, http_calls=6, grpc_calls=3)
        # Both rows once every request is counted: the queue is the model's (both protocols'), so a row
        # read while the other protocol's requests were still running could show one of them queued.
        http, grpc = wait.until(lambda b: (h := _live_row(b, "http")) and (g := _live_row(b, "grpc"))
                                and h["requests"] == "6" and g["requests"] == "3" and (h, g))
        # The same redraw that counted them shows their rate and latency (each point covers the last 5 s).
        assert float(http["rate"]) > 0 and float(http["p50"]) > 0 and float(http["p99"]) >= float(http["p50"])
        assert float(grpc["rate"]) > 0 and http["rejected"] == grpc["rejected"] == "0"
        assert float(http["batch"]) >= 1.0 and http["queue"] == "0"
        # The requests/s chart: a line per protocol, each ending in a dot above the zero line (y = 100).
        dots = browser.execute_script("return Object.fromEntries([...document.querySelectorAll('#chart-rate circle')]"
                                      ".map((c) => [c.dataset.series, +c.getAttribute('cy')]));")
        assert set(dots) == {"http", "grpc"} and all(0 <= y < 100 for y in dots.values())
        assert len(browser.execute_script("return document.querySelectorAll('#chart-rate path');")) == 2


def test_a_small_image_is_previewed_enlarged_without_smoothing(tmp_path_factory, tmp_path, browser):
    from PIL import Image
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    run_dir, _ = train_tiny_run(tmp_path_factory)
    Image.new("RGB", (8, 8), (250, 40, 40)).save(tmp_path / "digit.png")  # the digits demo's size
    Image.new("RGB", (200, 150), (40, 40, 250)).save(tmp_path / "photo.png")
    with uvicorn_thread(create_app([serve_model(run_dir)], RequestSettings())) as base:
        browser.get(base + "/")
        wait = WebDriverWait(browser, 30)
        wait.until(lambda b: b.find_element(By.ID, "image-ui").is_displayed())
        browser.find_element(By.ID, "files").send_keys(f"{tmp_path / 'digit.png'}\n{tmp_path / 'photo.png'}")
        small = wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#results img.thumb.pixelated"))
        thumbs = browser.execute_script(
            "return [...document.querySelectorAll('#results .result')].map((r) => { const img = r.querySelector('img');"
            " return {name: r.querySelector('b').textContent, rendering: getComputedStyle(img).imageRendering,"
            " width: img.getBoundingClientRect().width, height: img.getBoundingClientRect().height,"
            " loaded: img.complete}; });")
    assert len(small) == 1
    by_name = {t["name"]: t for t in thumbs}
    # 8 px x 12 (the largest whole factor within the 96 px box): every source pixel a sharp 12x12 square.
    assert by_name["digit.png"] == {"name": "digit.png", "rendering": "pixelated", "width": 96, "height": 96,
                                    "loaded": True}
    assert by_name["photo.png"]["rendering"] == "auto" and by_name["photo.png"]["height"] == 96  # scaled down, smoothed
