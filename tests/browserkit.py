"""Headless Chromium for the page's tests (Debian's `chromium` and `chromium-driver`).

Skipped without them unless `CI` is set, where their absence fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,900",
)


@contextlib.contextmanager
def chromium(folder: Path) -> Iterator[webdriver.Chrome]:
    """A headless Chromium with its own profile under `folder`; quit on exit."""
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver is None:
        if os.environ.get("CI"):
            pytest.fail("chromium and chromium-driver are missing (and CI is set)")
        pytest.skip("needs Debian's chromium and chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={folder / 'chromium'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    try:
        yield chrome
    finally:
        chrome.quit()


def script_errors(browser: webdriver.Chrome) -> list[str]:
    """The page's JavaScript errors and CSP refusals so far (not network errors: a test may
    take the service away, and an answered 4xx is logged as one)."""
    entries: list[dict[str, Any]] = browser.get_log("browser")
    return [
        str(e["message"])
        for e in entries
        if e["level"] == "SEVERE" and e.get("source") in ("javascript", "security")
    ]


def page_value(browser: webdriver.Chrome, expression: str) -> Any:
    """A value of `window.fleetPage`, e.g. `events` or `timings.listed_ms`."""
    return browser.execute_script(f"return window.fleetPage.{expression}")


SCREENSHOTS_ENV = "FLEET_PAGE_SCREENSHOTS"


def screenshot(browser: webdriver.Chrome, name: str) -> None:
    """Save `name`.png into $FLEET_PAGE_SCREENSHOTS when it is set (docs/img/ is made so)."""
    folder = os.environ.get(SCREENSHOTS_ENV)
    if folder:
        browser.save_screenshot(str(Path(folder) / f"{name}.png"))
