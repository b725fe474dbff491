"""Headless Chromium for the page tests: Debian's ``chromium`` and ``chromium-driver``,
driven by Selenium (``bootstrap.sh test`` installs both where it may)."""

from __future__ import annotations

import os
import shutil
import time

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def have_browser() -> bool:
    """Whether headless Chromium and its driver are installed."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return False
    return bool(CHROMIUM and CHROMEDRIVER)


#: Skips without a browser, except in CI (``CI`` set), where a missing browser is a failure.
needs_browser = pytest.mark.skipif(not have_browser() and not os.environ.get("CI"),
                                   reason="needs chromium, chromium-driver and selenium (bash bootstrap.sh test "
                                          "installs them)")


def start_browser(width: int = 1280, height: int = 1000):
    """A headless Chromium that keeps the page's console messages (see :func:`console_errors`)."""
    if not have_browser():
        raise RuntimeError("no chromium, chromium-driver or selenium: run `bash bootstrap.sh test` as root")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}", "--no-first-run", "--no-proxy-server"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def console_errors(driver) -> list[str]:
    """The page's console errors (and failed loads) since the last call."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def wait_for(driver, script: str, timeout: float = 60.0, poll: float = 0.25):
    """Run ``script`` (``return ...``) in the page until it returns something truthy; returns that."""
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script(script)
        if value:
            return value
        if time.monotonic() > deadline:
            text = driver.execute_script("return document.body ? document.body.innerText : ''") or ""
            raise AssertionError(f"the page at {driver.current_url} did not satisfy {script!r} within "
                                 f"{timeout:.0f} s; it shows:\n{text[:1500]}")
        time.sleep(poll)
