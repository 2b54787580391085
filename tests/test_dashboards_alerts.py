"""Grafana dashboards and Prometheus alert rules: valid, tested with promtool, on ARCHITECTURE.md §6 metric names."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "grafana" / "alerts" / "archiver.rules.yml"
RULES_TEST = REPO / "grafana" / "alerts" / "archiver.rules.test.yml"
DASHBOARDS = sorted((REPO / "grafana" / "dashboards").glob("*.json"))

# ARCHITECTURE.md §6, exactly. Histograms expose _bucket/_sum/_count; counters end in _total.
# sessionhost_upstream_<name> re-exposes the upstream's families: session_count is the only one known.
# §6 gives no type for archiver_upstream_poll_duration_seconds; archiver/exporter/selfmetrics.py makes it a
# histogram (checked against the implementation below).
HISTOGRAMS = [
    "archiver_upstream_poll_duration_seconds",
    "archiver_fetch_deadline_slack_seconds",
    "archiver_completion_delay_seconds",
]
KNOWN_METRICS = frozenset(
    [
        "sessionhost_upstream_session_count",
        "sessionhost_session_info",
        "sessionhost_session_created_timestamp_seconds",
        "sessionhost_session_players",
        "sessionhost_session_status",
        "sessionhost_session_labels",
        "sessionhost_sessions",
        "sessionhost_players",
        "archiver_build_info",
        "archiver_upstream_up",
        "archiver_upstream_last_success_timestamp_seconds",
        "archiver_upstream_requests_total",
        "archiver_sessions_exported",
        "archiver_sessions_dropped",
        "archiver_sessions_ended_total",
        "archiver_items_total",
        "archiver_pending_items",
        "archiver_next_fetch_deadline_timestamp_seconds",
        "archiver_bytes_total",
        "archiver_spool_bytes",
        "archiver_retention_seconds",
        "archiver_last_archive_success_timestamp_seconds",
        *(f"{h}{suffix}" for h in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")),
        "up",  # Prometheus' own scrape health, for ArchiverDown
    ]
)
EXPECTED_ALERTS = {
    "ArchiverDown",
    "ArchiverUpstreamDown",
    "ArchiverFetchDeadlineNear",
    "ArchiverItemsExpired",
    "ArchiverUploadBacklog",
    "ArchiverSpoolLarge",
    "ArchiverNoRecentArchive",
    "ArchiverSessionsDropped",
}
# PromQL words that look like metric names but are not.
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                   "unless", "bool", "offset", "inf", "nan"}  # fmt: skip
GRAFANA_DURATIONS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (strings, matchers, label lists, ranges removed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|`[^`]*`', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\$\{?\w+\}?", " ", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        if m.start() and (e[m.start() - 1].isdigit() or e[m.start() - 1] == "."):
            continue  # the exponent or unit of a number: 5e9, 1.5e3
        if e[m.end() :].lstrip().startswith("("):
            continue  # a function or aggregation
        if m.group(0).lower() not in PROMQL_KEYWORDS:
            names.add(m.group(0))
    return names


def test_metric_name_extraction() -> None:
    """The extractor behind the name checks finds selectors and ignores everything else."""
    expr = (
        'topk(20, a_total{job=~"$job", x="b_total"} * on (job, session_id) group_left (image) '
        "b_info) + sum by (le) (rate(c_bucket[$__rate_interval] offset 5m)) > 5e9 and bool time()"
    )
    assert metric_names(expr) == {"a_total", "b_info", "c_bucket"}


def load_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard_exprs(board: dict[str, Any]) -> list[str]:
    """Every PromQL expression of a dashboard: panel targets and template variable queries."""
    exprs = []
    for panel in all_panels(board):
        exprs.extend(t["expr"] for t in panel.get("targets", []))
    for var in board["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        match = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
        assert match, f"unexpected variable query {query!r}"
        exprs.append(match.group(1))
    return exprs


def all_panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    panels = []
    for panel in board["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # panels of collapsed rows
    return panels


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (CI installs Debian's prometheus package)")
    return path


def run_promtool(promtool: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, timeout=60, check=False)


def test_alert_rules_pass_promtool_check(promtool: str) -> None:
    result = run_promtool(promtool, "check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(EXPECTED_ALERTS)} rules found" in result.stdout


def test_alert_rules_unit_tests_pass(promtool: str) -> None:
    """Each alert fires on synthetic series and stays quiet otherwise (archiver.rules.test.yml)."""
    result = run_promtool(promtool, "test", "rules", RULES_TEST)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(
    ("original", "broken"),
    [
        # Unscoped, the rule would also page for an account whose /metrics answers 404 for good.
        ('expr: archiver_upstream_up{endpoint="sessions"} == 0', "expr: archiver_upstream_up == 0"),
        ('{outcome="expired"}[1h]) > 0', '{outcome="archived"}[1h]) > 0'),
        ("time() < 1800", "time() < 60"),
    ],
    ids=["ArchiverUpstreamDown", "ArchiverItemsExpired", "ArchiverFetchDeadlineNear"],
)
def test_alert_unit_tests_catch_a_broken_rule(promtool: str, tmp_path: Path, original: str, broken: str) -> None:
    """The unit tests are not vacuous: a rule with a wrong expression makes them fail."""
    text = RULES.read_text()
    assert text.count(original) == 1
    (tmp_path / RULES.name).write_text(text.replace(original, broken))
    shutil.copy(RULES_TEST, tmp_path / RULES_TEST.name)
    result = run_promtool(promtool, "test", "rules", tmp_path / RULES_TEST.name)
    assert result.returncode != 0, result.stdout


def test_every_alert_is_documented() -> None:
    """The expected alerts exist, each with a severity, summary, description and runbook hint."""
    rules = load_rules()
    assert {r["alert"] for r in rules} == EXPECTED_ALERTS
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        for key in ("summary", "description", "runbook"):
            assert rule["annotations"].get(key, "").strip(), f"{rule['alert']} has no {key}"
    severities = {r["alert"]: r["labels"]["severity"] for r in rules}
    assert severities["ArchiverItemsExpired"] == "critical"


def test_alert_expressions_use_only_design_metric_names() -> None:
    for rule in load_rules():
        names = metric_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= KNOWN_METRICS, f"{rule['alert']}: unknown {names - KNOWN_METRICS}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_dashboard_expressions_use_only_design_metric_names(path: Path) -> None:
    board = json.loads(path.read_text())
    for expr in dashboard_exprs(board):
        names = metric_names(expr)
        assert names, expr
        assert names <= KNOWN_METRICS, f"{path.name}: unknown {names - KNOWN_METRICS} in {expr}"


def used_metric_names() -> set[str]:
    used = set()
    for path in DASHBOARDS:
        for expr in dashboard_exprs(json.loads(path.read_text())):
            used |= metric_names(expr)
    for rule in load_rules():
        used |= metric_names(rule["expr"])
    return used


def test_archiver_metric_names_match_the_implementation() -> None:
    """Every archiver_* series the dashboards and alerts query is one archiver.exporter.selfmetrics exposes
    (the two snapshot gauges come from archiver.exporter.exposition)."""
    from prometheus_client import CollectorRegistry

    from archiver.exporter.selfmetrics import SelfMetrics

    registry = CollectorRegistry()
    # The next-deadline gauge is absent while nothing is pending: make one pending.
    SelfMetrics(registry).set_next_fetch_deadline(1_700_000_000.0)
    exposed = set()
    for family in registry.collect():
        if family.type == "counter":
            exposed.add(f"{family.name}_total")
        elif family.type == "histogram":
            exposed |= {f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count")}
        else:
            exposed.add(family.name)
    snapshot_gauges = {"archiver_sessions_exported", "archiver_sessions_dropped"}
    used = {name for name in used_metric_names() if name.startswith("archiver_")}
    assert used - snapshot_gauges <= exposed, used - snapshot_gauges - exposed


def test_dashboards_cover_the_pipeline_and_fleet_metrics() -> None:
    """The panels asked for exist: every §6 metric is charted except the per-session details."""
    used = set()
    for path in DASHBOARDS:
        for expr in dashboard_exprs(json.loads(path.read_text())):
            used |= metric_names(expr)
    not_charted = {"sessionhost_session_labels", "up"}
    assert KNOWN_METRICS - not_charted <= used, KNOWN_METRICS - not_charted - used


def test_dashboard_expressions_are_valid_promql(promtool: str, tmp_path: Path) -> None:
    """promtool parses every dashboard query (Grafana's $variables substituted) as a recording rule."""
    rules = []
    for path in DASHBOARDS:
        for expr in dashboard_exprs(json.loads(path.read_text())):
            for var, duration in GRAFANA_DURATIONS.items():
                expr = expr.replace(var, duration)
            expr = re.sub(r"\$\{?\w+\}?", ".*", expr)
            rules.append({"record": f"dashboard:query_{len(rules)}:check", "expr": expr})
    rules_file = tmp_path / "dashboard-queries.rules.yml"
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = run_promtool(promtool, "check", "rules", rules_file)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_dashboard_structure(path: Path) -> None:
    """Grafana 10 JSON: schemaVersion 39, unique ids, the datasource/job/instance variables,
    every query on ${datasource}, and no two panels overlapping on the grid."""
    board = json.loads(path.read_text())
    assert board["schemaVersion"] == 39
    assert board["uid"] and board["title"] and board["id"] is None
    panels = all_panels(board)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids in {path.name}"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"job", "instance"} <= variables.keys()
    cells: dict[tuple[int, int], int] = {}
    for panel in panels:
        assert panel["title"], panel["id"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"panels {cells[(x, y)]} and {panel['id']} overlap"
                cells[(x, y)] = panel["id"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs))
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"


def test_dashboard_uids_are_unique() -> None:
    uids = [json.loads(p.read_text())["uid"] for p in DASHBOARDS]
    assert len(DASHBOARDS) == 2 and len(set(uids)) == len(uids)
