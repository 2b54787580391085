"""The evidence browser in a real browser: Debian's Chromium driven by selenium through chromium-driver.

Run with `make test-browser` (pytest -m browser). A machine without chromium/chromedriver skips it,
except under CI=true, where a missing browser is a failure: CI installs it (.ci/run).
With BROWSE_SCREENSHOTS=DIR the list, session and search pages are saved there (the README's
pictures: `BROWSE_SCREENSHOTS=docs make test-browser`). The browser is served under a path prefix,
as behind the chart's Ingress, and entered the way an SRE enters it: from a Grafana dashboard link.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from archiver.browse.app import BrowseApp
from archiver.browse.server import BrowseServer
from archiver.browse.urls import mount
from archiver.layout.manifest import ManifestItem
from archiver.retrieval.reindex import index_players
from archiver.store import ObjectStore, open_store
from tests.support import CHART, MINIMAL, free_port, one, put_session, render, wait_until

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
HOSTILE_ID = '<script>alert("pwned")</script>-match-42'
HOSTILE_LABEL = "<img src=x onerror=alert(1)>"
REPLAY = bytes(range(256)) * 8192 + b"replay-end"  # 2 MiB
PREFIX = "/tools/evidence"
PLAYER = "p-4711"
PLANTED = "anticheat: speedhack detected for p-4711 (aimbot signature 7f3a)"
#: The planted line's number: on the second page of 500 lines in the log viewer.
PLANTED_LINE = 742


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
    """30 ranked matches (some without a crash folder, as most matches), a player's cup matches with a
    planted anticheat line, and a session whose id and label are markup."""
    root = tmp_path / "archive"
    root.mkdir()
    store = open_store(root.as_uri())
    now = time.time()
    no_crash = ManifestItem(
        kind="artifact", source="GET /artifacts?path=/srv/crash", outcome="source_gone", path="/srv/crash"
    )
    for i in range(30):
        put_session(
            store, f"ranked-{i:02d}", ended_at=now - 600 - i * 700, labels={"mode": "ranked"},
            extra_items=[no_crash] if i % 3 else [], players=(f"p-{100 + i}", f"p-{200 + i}"),
        )  # fmt: skip
    cup_log = b"".join(b"tick %d: all quiet\n" % n for n in range(1, PLANTED_LINE)) + PLANTED.encode() + b"\n"
    for i, ended in enumerate((900, 4000, 9000)):
        put_session(
            store, f"cup-{i + 1}", ended_at=now - ended, labels={"mode": "cup"}, players=(PLAYER, f"p-{300 + i}"),
            logs=cup_log + b"match over\n" if i == 1 else b"boot\nmatch over\n",
            artifacts={"/srv/replays/match.replay": REPLAY},
        )  # fmt: skip
    put_session(
        store,
        HOSTILE_ID,
        ended_at=now - 120,
        labels={"mode": "tournament", "note": HOSTILE_LABEL},
        logs=b"match started\n<script>alert('log')</script>\nplayer p1 kicked: speedhack\nmatch over\n",
        artifacts={"/srv/replays/match.replay": REPLAY},
        extra_items=[no_crash],
    )
    index_players(store)
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
    with BrowseServer(("127.0.0.1", 0), BrowseApp(archive, page_size=20, mount=mount(None, PREFIX))) as server:
        driver.get(server.url + "/")
        _wait_for_url(driver, PREFIX + "/sessions")
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


class ChartBrowser:
    """`archiver browse` started exactly as the chart's browser Deployment starts it (its args, its
    rendered config.toml), on 127.0.0.1; and the dashboards the chart provisions beside it.

    The chart is rendered with the browser on and ``browser.externalUrl`` under PREFIX, as behind an
    Ingress path: the same URL becomes the dashboards' ``browser_url``.
    """

    def __init__(self, archive_root: Path, workdir: Path) -> None:
        import helm_python as helm

        port = free_port()
        self.url = f"http://127.0.0.1:{port}{PREFIX}"
        values = {
            **MINIMAL,
            "config": {**MINIMAL["config"], "store": archive_root.as_uri()},
            "browser": {"enabled": True, "port": port, "externalUrl": self.url},
            "dashboards": {"enabled": True},
        }
        with helm.Chart.load(CHART) as chart:
            docs = render(chart, values)
        (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
        config = workdir / "config.toml"
        config.write_text(one(docs, "ConfigMap", "arch-archiver")["data"]["config.toml"])
        args: list[str] = container["args"]
        args[args.index("--config") + 1] = str(config)
        listen = args.index("--web.listen-address") + 1
        assert args[listen] == f"0.0.0.0:{port}"
        args[listen] = f"127.0.0.1:{port}"  # tests listen on loopback only
        self.probe = f"http://127.0.0.1:{port}" + container["readinessProbe"]["httpGet"]["path"]
        self.dashboards = {
            name: json.loads(body)
            for cm in docs
            if cm["kind"] == "ConfigMap" and "grafana_dashboard" in cm["metadata"]["labels"]
            for name, body in cm["data"].items()
        }
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARCHIVER_")}
        self.log = workdir / "browse.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "archiver.cli", *args], env=env, stderr=log)

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"archiver browse exited: {self.log.read_text()[-3000:]}")
        try:
            return httpx.get(self.probe, timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)

    def dashboard_link(self, board: str, sid: str) -> str:
        """The Session data link of a provisioned dashboard, as Grafana resolves it for ``sid``:
        ``${browser_url:raw}`` is the variable's current value, ``${__value.raw:percentencode}`` the
        value through encodeURIComponent (which leaves ``A-Za-z0-9-_.!~*'()`` alone)."""
        dashboard = self.dashboards[board]
        (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "browser_url"]
        panels = [p for top in dashboard["panels"] for p in (top, *top.get("panels", []))]
        urls = {
            link["url"]
            for panel in panels
            for override in panel.get("fieldConfig", {}).get("overrides", [])
            if override["matcher"] == {"id": "byName", "options": "Session"}
            for prop in override["properties"]
            if prop["id"] == "links"
            for link in prop["value"]
        }
        assert len(urls) == 1, urls
        return (
            urls.pop()
            .replace("${browser_url:raw}", variable["current"]["value"])
            .replace("${__value.raw:percentencode}", quote(sid, safe="-_.!~*'()"))
        )


@pytest.fixture
def chart_browser(archive: ObjectStore, tmp_path: Path) -> Iterator[ChartBrowser]:
    """The browser as the chart deploys it, over ``archive``, ready (its own readiness probe answers)."""
    browser = ChartBrowser(Path(archive.url.removeprefix("file://")), tmp_path)
    try:
        wait_until(browser.ready, message="the chart's browser readiness probe")
        yield browser
    finally:
        browser.stop()


def test_from_a_dashboard_link_to_a_players_match_its_planted_line_and_its_replay(
    driver: Any, chart_browser: ChartBrowser
) -> None:
    """The chart's dashboard link → its browser under a path prefix → the player's matches → a log
    search → the hit's line on its log page → the replay downloaded with the manifest's sha256."""
    from selenium.webdriver.common.by import By

    shots = os.environ.get("BROWSE_SCREENSHOTS")
    # Grafana: a session id in the pipeline dashboard's "recently ended" table.
    driver.get(chart_browser.dashboard_link("archiver.json", "cup-1"))
    assert driver.find_element(By.ID, "session-id").text == "cup-1"
    assert driver.current_url.startswith(chart_browser.url + "/sessions/cup-1")

    # The player's other matches, from the player index.
    player = next(a for a in driver.find_elements(By.CSS_SELECTOR, "#players a.player") if a.text == PLAYER)
    player.click()
    _wait_for_url(driver, "player=")
    assert [a.text for a in driver.find_elements(By.CSS_SELECTOR, "a.session")] == ["cup-1", "cup-2", "cup-3"]

    # Which of them logged the anticheat line: the log search, streamed, with its final status.
    driver.find_element(By.ID, "nav-search").click()
    _wait_for_url(driver, PREFIX + "/search")
    driver.find_element(By.NAME, "player").send_keys(PLAYER)
    driver.find_element(By.NAME, "since").send_keys("2d")
    pattern = driver.find_element(By.NAME, "q")
    pattern.send_keys("speedhack detected")
    pattern.submit()
    _wait_for_url(driver, "q=")
    status = driver.find_element(By.ID, "search-status")
    assert status.text.startswith("Done: searched 3 sessions") and "1 hit" in status.text
    assert not driver.find_element(By.ID, "searching").is_displayed()  # the "searching…" line is gone
    hits = driver.find_elements(By.CSS_SELECTOR, "#hits tr.hit")
    assert [h.find_element(By.CSS_SELECTOR, "td.line").text for h in hits] == [PLANTED]
    _no_alert(driver)
    if shots:
        driver.save_screenshot(str(Path(shots) / "browser-search.png"))

    # The hit opens its line on the log page that holds it.
    line_link = hits[0].find_element(By.CSS_SELECTOR, "a.hit-line")
    assert line_link.text == f"L{PLANTED_LINE}"
    line_link.click()
    _wait_for_url(driver, f"#L{PLANTED_LINE}")
    assert "start=500" in driver.current_url
    anchor = driver.find_element(By.ID, f"L{PLANTED_LINE}")
    assert anchor.find_element(By.XPATH, "following-sibling::span[1]").text == PLANTED
    assert driver.find_element(By.CSS_SELECTOR, "a.n:target").get_attribute("id") == f"L{PLANTED_LINE}"

    # Back to the match, and its replay as stored.
    driver.find_element(By.CSS_SELECTOR, "h1 a.mono").click()
    _wait_for_url(driver, PREFIX + "/sessions/cup-2")
    rows = driver.find_elements(By.CSS_SELECTOR, "#items tbody tr")
    replay_row = next(row for row in rows if "match.replay" in row.text)
    expected = replay_row.find_element(By.CSS_SELECTOR, ".sha").text
    download = replay_row.find_element(By.CSS_SELECTOR, "a.download")
    assert download.get_attribute("href").startswith(chart_browser.url + "/sessions/cup-2/items/")
    download.click()
    downloaded = _wait_for_file(driver, driver.downloads, 60)
    assert hashlib.sha256(downloaded.read_bytes()).hexdigest() == expected == hashlib.sha256(REPLAY).hexdigest()
