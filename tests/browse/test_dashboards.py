"""The Grafana dashboards link session ids to the evidence browser, and those links open the session's page."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from archiver.browse.app import BrowseApp
from archiver.store import open_store
from tests.support import put_session

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((REPO / "grafana" / "dashboards").glob("*.json"))
LINK = "${browser_url:raw}/sessions/${__value.raw:percentencode}"


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    panels = []
    for panel in board["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def _session_links(panel: dict[str, Any]) -> list[str]:
    return [
        link["url"]
        for override in panel.get("fieldConfig", {}).get("overrides", [])
        if override["matcher"] == {"id": "byName", "options": "Session"}
        for prop in override["properties"]
        if prop["id"] == "links"
        for link in prop["value"]
    ]


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_every_session_table_links_its_ids_to_the_browser(path: Path) -> None:
    """A browser_url textbox variable, and each table showing session ids links them to /sessions/{id}."""
    board = json.loads(path.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["browser_url"]["type"] == "textbox"
    tables = [
        p for p in _panels(board) if p["type"] == "table" and "session_id" in json.dumps(p.get("transformations"))
    ]
    assert tables, f"{path.name} has no session table"
    for table in tables:
        assert _session_links(table) == [LINK], table["title"]


def test_a_dashboard_link_with_a_hostile_id_opens_that_sessions_page(tmp_path: Path) -> None:
    """Grafana's percentencode (encodeURIComponent) of an id with /, ?, # and markup is one path segment we serve."""
    root = tmp_path / "archive"
    root.mkdir()
    store = open_store(root.as_uri())
    sid = "eu/match?round=2#<b>final</b> 試合"
    put_session(store, sid, ended_at=time.time() - 60)
    encoded = quote(sid.encode(), safe="!'()*-._~")  # what encodeURIComponent leaves alone
    url = LINK.replace("${browser_url:raw}", "").replace("${__value.raw:percentencode}", encoded)
    response = BrowseApp(store).handle(url)
    assert response.status == 200
    assert b"&lt;b&gt;final&lt;/b&gt;" in b"".join(response.body)
