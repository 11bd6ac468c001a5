"""The page at / in a real headless browser (Debian's chromium + chromium-driver, driven by selenium)."""

from __future__ import annotations

import shutil

import pytest
import torch
from serve_helpers import serve_model, train_tiny_run, uvicorn_thread

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
