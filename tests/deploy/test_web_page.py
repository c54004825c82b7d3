"""The web page in a real headless Chromium (Debian's ``chromium`` and ``chromedriver``), driven
by Selenium against a real service process: the elements found by their accessible names; a
missing and a wrong key, and an overload, shown in words; a text typed, translated and streamed
in; a file uploaded, translated and downloaded."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.deploy.conftest import Process, require, start_service

SRT = "1\n00:00:01,000 --> 00:00:02,000\nGood morning.\n\n2\n00:00:03,000 --> 00:00:04,000\nBye.\n"


@pytest.fixture
def page_service(data_dir: Path, tmp_path: Path) -> Iterator[Process]:
    process = start_service(
        data_dir,
        tmp_path / "service.log",
        HYMT_API_KEYS=json.dumps(["page-key"]),
        HYMT_MAX_NEW_TOKENS="12",
        HYMT_MAX_TEXT_CHARS="200",  # a longer text is a document of several segments
        HYMT_MAX_QUEUE_SIZE="4",  # ... and one of five segments is more than the queue holds
    )
    yield process
    process.stop()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = require("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1200,900")
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    options.add_experimental_option(
        "prefs",
        {"download.default_directory": str(downloads), "download.prompt_for_download": False},
    )
    driver = webdriver.Chrome(options=options, service=DriverService(require("chromedriver")))
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


def named(driver: WebDriver, name: str) -> WebElement:
    """The visible element whose accessible name is ``name`` (what a screen reader announces)."""
    candidates = driver.find_elements(
        "css selector", "input, textarea, select, button, a, [role=region], [role=alert]"
    )
    found = [element for element in candidates if element.accessible_name == name]
    assert found, f"no element named {name!r}"
    return found[0]


def alert(driver: WebDriver) -> str:
    return str(driver.find_element("css selector", "[role=alert]").text)


def wait(driver: WebDriver, condition: object, timeout_s: float = 30) -> None:
    WebDriverWait(driver, timeout_s, poll_frequency=0.05).until(condition)  # type: ignore[arg-type]


def test_a_person_translates_text_and_a_file_and_reads_what_went_wrong(
    page_service: Process, browser: WebDriver, tmp_path: Path
) -> None:
    browser.get(f"{page_service.url}/")
    # No key yet: the service needs one, and the page says so.
    wait(browser, lambda d: "API key" in alert(d))
    key = named(browser, "API key")
    key.send_keys("wrong-key")
    named(browser, "Use this key").click()
    wait(browser, lambda d: "not accepted" in alert(d))
    key.clear()
    key.send_keys("page-key", Keys.ENTER)
    wait(browser, lambda d: len(Select(named(d, "Target language")).options) > 30)
    assert alert(browser) == ""

    Select(named(browser, "Target language")).select_by_value("de")
    text = named(browser, "Text to translate")
    text.send_keys("Good morning, how are you today?")
    named(browser, "Translate").click()
    translation = named(browser, "Translation")
    wait(
        browser,
        lambda d: translation.text.strip() and translation.get_attribute("aria-busy") == "false",
    )
    assert int(translation.get_attribute("data-pieces") or 0) >= 2  # it streamed in
    assert "Detected:" in browser.find_element("id", "detected").text
    timing = browser.find_element("id", "timing").text
    assert "queue" in timing
    assert "inference" in timing
    assert named(browser, "Copy translation").is_enabled()
    assert alert(browser) == ""
    if os.environ.get("HYMT_SCREENSHOT"):
        browser.save_screenshot(os.environ["HYMT_SCREENSHOT"])

    # More segments than the queue ever holds: the refusal is told in words, with what to do
    # (not "busy": waiting would not help).
    text.clear()
    text.send_keys("\n".join(f"Line {n} of a text that is long enough. " * 2 for n in range(6)))
    named(browser, "Translate").click()
    wait(browser, lambda d: "send the text in shorter parts" in alert(d))

    # A file: uploaded, its progress shown, its translation downloaded.
    subtitles = tmp_path / "talk.srt"
    subtitles.write_text(SRT, "utf-8")
    named(browser, "File to translate").send_keys(str(subtitles))
    named(browser, "Translate file").click()
    wait(browser, lambda d: d.find_element("id", "download").is_displayed())
    assert browser.find_element("id", "file-status").text == "Done."
    browser.find_element("id", "download").click()
    downloaded = tmp_path / "downloads" / "talk_de.srt"
    deadline = time.monotonic() + 30
    while not downloaded.exists():
        assert time.monotonic() < deadline, "the download did not arrive"
        time.sleep(0.05)
    content = downloaded.read_text("utf-8")
    assert content.startswith("1\n00:00:01,000 --> 00:00:02,000\n")
    assert "2\n00:00:03,000 --> 00:00:04,000\n" in content
    assert "Good morning." not in content
    assert alert(browser) == ""  # the earlier error went away with the next success


def test_without_keys_the_page_asks_for_none_and_the_api_docs_render_offline(
    data_dir: Path, tmp_path: Path, browser: WebDriver
) -> None:
    process = start_service(data_dir, tmp_path / "service.log", HYMT_MAX_NEW_TOKENS="4")
    try:
        browser.get(f"{process.url}/")
        wait(browser, lambda d: len(Select(named(d, "Target language")).options) > 30)
        # The service has no keys: the key box stays shut and nothing asks for one.
        assert browser.find_element("id", "key-box").get_attribute("open") is None
        assert alert(browser) == ""
        # Swagger UI from the service itself (this machine has no internet): its operations
        # render, and nothing on the page comes from another origin.
        browser.get(f"{process.url}/docs")
        wait(browser, lambda d: len(d.find_elements("css selector", ".opblock")) >= 5)
        paths = {e.text for e in browser.find_elements("css selector", ".opblock-summary-path")}
        assert {"/translate", "/batch_translate", "/health"} <= paths, paths
        sources = browser.execute_script(
            "return [...document.querySelectorAll('script[src], link[href]')]"
            ".map(e => e.src || e.href)"
        )
        assert sources
        assert all(str(s).startswith(process.url) for s in sources), sources
    finally:
        process.stop()
