"""Headless Chromium for viewer tests and the viewer benchmark (Debian's chromium + chromedriver)."""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
DRIVER = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
# The machine's network is closed: without these, Chromium keeps trying to reach Google.
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,900")


def find(candidates: tuple[str, ...], name: str) -> str:
    for path in candidates:
        if Path(path).exists():
            return path
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed; `make test` installs Debian's chromium and "
                           "chromium-driver (apt-get install chromium chromium-driver)")
    return found


def start_browser() -> Any:
    """A selenium Chrome driver on the system Chromium, with a fresh profile."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tempfile.mkdtemp(prefix='torchlog-chromium-')}")
    options.binary_location = find(CHROMIUM, "chromium")
    return webdriver.Chrome(options=options, service=Service(find(DRIVER, "chromedriver")))


def wait_for(driver: Any, script: str, timeout_s: float = 120.0) -> Any:
    """Poll `script` (JS returning a value) until it is truthy; raise with the page status."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(0.05)
    status = driver.execute_script("return document.getElementById('torchlog-status')?.textContent")
    raise TimeoutError(f"waited {timeout_s} s for {script!r}; page status: {status!r}")


def open_page(driver: Any, path: str | Path, timeout_s: float = 120.0) -> None:
    """Load a viewer page and wait until its first drawing is done (or it reported failure)."""
    driver.get(Path(path).resolve().as_uri())
    state = wait_for(driver, "return document.body.dataset.ready", timeout_s)
    if state != "true":
        status = driver.execute_script("return document.getElementById('torchlog-status').textContent")
        raise AssertionError(f"the viewer did not draw: {status}")


def renders(driver: Any) -> int:
    return int(driver.execute_script("return document.body.dataset.renders || '0'"))


def run_and_wait(driver: Any, script: str, timeout_s: float = 120.0) -> Any:
    """Run a JS action that redraws the graph and wait for the redraw to finish."""
    before = renders(driver)
    result = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        f"Promise.resolve((async () => {{ {script} }})()).then(done, (e) => done('error: ' + e));")
    wait_for(driver, f"return Number(document.body.dataset.renders || 0) > {before}", timeout_s)
    return result
