"""The evidence browser in a real browser: Debian's Chromium driven by selenium through chromium-driver.

Run with `make test-browser` (pytest -m browser). A machine without chromium/chromedriver skips it,
except under CI=true, where a missing browser is a failure: CI installs it (.ci/run).
With BROWSE_SCREENSHOTS=DIR the list and session pages are saved there (the README's pictures).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from archiver.browse.app import BrowseApp
from archiver.browse.server import BrowseServer
from archiver.store import ObjectStore, open_store
from tests.support import put_session

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
HOSTILE_ID = '<script>alert("pwned")</script>-match-42'
HOSTILE_LABEL = "<img src=x onerror=alert(1)>"
REPLAY = bytes(range(256)) * 8192 + b"replay-end"  # 2 MiB


def _need_tools() -> None:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if shutil.which(path) is None]
    if importlib.util.find_spec("selenium") is None:
        missing.append("selenium (make test-browser installs it in .venv-browser)")
    if missing:
        message = f"missing {', '.join(missing)} (apt-get install chromium chromium-driver)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Any]:
    """A headless Chromium that downloads into tmp_path/downloads; selenium-manager is never asked for a driver."""
    _need_tools()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    downloads = tmp_path / "downloads"
    downloads.mkdir()
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        f"--user-data-dir={tmp_path / 'profile'}",
    ):
        options.add_argument(flag)
    options.add_experimental_option(
        "prefs", {"download.default_directory": str(downloads), "download.prompt_for_download": False}
    )
    browser = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    browser.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    browser.downloads = downloads  # type: ignore[attr-defined]
    # click() and submit() return before the next page has loaded: lookups poll for up to 10 s.
    browser.implicitly_wait(10)
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture
def archive(tmp_path: Path) -> Iterator[ObjectStore]:
    root = tmp_path / "archive"
    root.mkdir()
    store = open_store(root.as_uri())
    now = time.time()
    for i in range(30):
        put_session(store, f"ranked-{i:02d}", ended_at=now - 600 - i * 700, labels={"mode": "ranked"})
    put_session(
        store,
        HOSTILE_ID,
        ended_at=now - 120,
        labels={"mode": "tournament", "note": HOSTILE_LABEL},
        logs=b"match started\n<script>alert('log')</script>\nplayer p1 kicked: speedhack\nmatch over\n",
        artifacts={"/srv/replays/match.replay": REPLAY},
    )
    yield store
    store.close()


def _no_alert(browser: Any) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert  # noqa: B018 - the property raises when no script opened a dialog


def _wait_for_file(browser: Any, directory: Path, deadline_s: float) -> Path:
    """The first finished download in ``directory``, polled with a deadline (Chromium signals nothing else)."""
    from selenium.webdriver.support.ui import WebDriverWait

    def finished(_: Any) -> Path | None:
        done = [p for p in directory.iterdir() if not p.name.endswith((".crdownload", ".tmp"))]
        return done[0] if done else None

    found: Path = WebDriverWait(browser, deadline_s, poll_frequency=0.05).until(finished)
    return found


def _wait_for_url(driver: Any, part: str) -> None:
    """Until the browser shows the page a click or submit asked for (its URL holds `part`)."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 15, poll_frequency=0.05).until(lambda d: part in d.current_url)


def test_from_the_list_to_a_hostile_sessions_logs_and_replay(driver: Any, archive: ObjectStore) -> None:
    """List → filter by label → hostile session (id and label shown as text, no script ran) → logs → replay sha256."""
    from selenium.webdriver.common.by import By

    shots = os.environ.get("BROWSE_SCREENSHOTS")
    with BrowseServer(("127.0.0.1", 0), BrowseApp(archive, page_size=20)) as server:
        driver.get(server.url + "/")
        rows = driver.find_elements(By.CSS_SELECTOR, "#sessions tbody tr")
        assert len(rows) == 20  # paged
        assert driver.find_element(By.CSS_SELECTOR, "a.session").text == HOSTILE_ID  # newest first, as text
        _no_alert(driver)
        if shots:
            driver.save_screenshot(str(Path(shots) / "browser-list.png"))

        field = driver.find_element(By.NAME, "label")
        field.send_keys("mode=tournament")
        field.submit()
        _wait_for_url(driver, "label=")
        links = driver.find_elements(By.CSS_SELECTOR, "a.session")
        assert [link.text for link in links] == [HOSTILE_ID]
        links[0].click()

        assert driver.find_element(By.ID, "session-id").text == HOSTILE_ID
        assert HOSTILE_LABEL in driver.find_element(By.ID, "facts").text
        assert driver.find_elements(By.CSS_SELECTOR, "script, img") == []
        _no_alert(driver)
        if shots:
            driver.save_screenshot(str(Path(shots) / "browser-session.png"))
        session_url = driver.current_url

        driver.find_element(By.ID, "logs-link").click()
        _wait_for_url(driver, "/logs")
        log = driver.find_element(By.ID, "log").text
        assert "<script>alert('log')</script>" in log and "speedhack" in log
        search = driver.find_element(By.NAME, "q")
        search.send_keys("SPEEDHACK")
        search.submit()
        _wait_for_url(driver, "q=")
        assert "kicked: speedhack" in driver.find_element(By.ID, "log").text
        assert "match started" not in driver.find_element(By.ID, "log").text
        _no_alert(driver)

        driver.get(session_url)
        rows = driver.find_elements(By.CSS_SELECTOR, "#items tbody tr")
        replay_row = next(row for row in rows if "match.replay" in row.text)
        expected = replay_row.find_element(By.CSS_SELECTOR, ".sha").text
        replay_row.find_element(By.CSS_SELECTOR, "a.download").click()
        downloaded = _wait_for_file(driver, driver.downloads, 60)
        assert hashlib.sha256(downloaded.read_bytes()).hexdigest() == expected
        assert downloaded.name.endswith(".tar.gz") and "<" not in downloaded.name
