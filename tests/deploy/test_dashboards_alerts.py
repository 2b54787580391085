"""Grafana dashboards and Prometheus alert rules: valid, tested with promtool, on ARCHITECTURE.md §6 names,
each alert with a runbook section, and scoped for a Prometheus shared by several releases and clusters
(every rule by its selector, every dashboard query by the cluster, namespace and job variables)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from archiver.exporter.families import FAMILIES
from archiver.metrics.selfmetrics import SelfMetrics
from tests.render_rules import STANDALONE_SELECTOR as RULES_SELECTOR

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "grafana" / "alerts" / "archiver.rules.yml"
RULES_TEST = REPO / "grafana" / "alerts" / "archiver.rules.test.yml"
RUNBOOK = REPO / "docs" / "runbook.md"
RUNBOOK_URL = "https://github.com/session-archiver/session-archiver/blob/main/docs/runbook.md"
DASHBOARDS = sorted((REPO / "grafana" / "dashboards").glob("*.json"))


def exposed_names(registry: CollectorRegistry) -> set[str]:
    """The series names a registry's families expose: counters end in _total, histograms add
    _bucket/_sum/_count."""
    names = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names |= {f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
    return names


def self_metrics_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    metrics = SelfMetrics(registry)
    # Gauges absent until first set (the next deadline while nothing is pending): set them.
    metrics.set_next_fetch_deadline(1_700_000_000.0)
    metrics.set_store_up(True)
    return registry


# The names a query may use: the exposition's table of families (archiver.exposition.FAMILIES),
# the self-metrics registry, the one upstream family known to exist (sessionhost_upstream_<name>
# re-exposes whatever the upstream serves) and Prometheus' own `up`.
KNOWN_METRICS = frozenset(
    {
        *(family.full_name() for family in FAMILIES),
        *exposed_names(self_metrics_registry()),
        "sessionhost_upstream_session_count",
        "up",  # Prometheus' own scrape health, for ArchiverDown
    }
)
#: What sizes a pod and tells an OOMKill or a descriptor leak coming (README, Metrics): charted per pod.
PROCESS_CHARTED = frozenset(
    {"process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds", "process_max_fds"}
)
#: Known series no dashboard charts: per-session labels, Prometheus' `up` (an alert's) and
#: diagnostics read from /metrics when something is already wrong.
NOT_CHARTED = frozenset(
    {
        "sessionhost_session_labels",
        "up",
        "archiver_errors_total",
        "archiver_retries_total",
        "archiver_store_conditional_writes_supported",
        "archiver_store_guarantee",
        # The process's own families (prometheus_client's process_* and python_*) but those the
        # pipeline dashboard's "Process (per pod)" row charts (PROCESS_CHARTED).
        *(
            name
            for name in exposed_names(self_metrics_registry())
            if name.startswith(("process_", "python_")) and name not in PROCESS_CHARTED
        ),
    }
)
EXPECTED_ALERTS = {
    "ArchiverDown",
    "ArchiverStoreDown",
    "ArchiverDetectionFailing",
    "ArchiverUpstreamInvalidEntries",
    "ArchiverUpstreamDown",
    "ArchiverFetchDeadlineNear",
    "ArchiverItemsExpired",
    "ArchiverItemsFailed",
    "ArchiverItemsConflict",
    "ArchiverItemsTooLarge",
    "ArchiverSessionsFailed",
    "ArchiverLiveCaptureGaps",
    "ArchiverLiveCaptureWriteFailed",
    "ArchiverCreateOnceEmulated",
    "ArchiverErrors",
    "ArchiverUploadBacklog",
    "ArchiverSpoolLarge",
    "ArchiverNoRecentArchive",
    "ArchiverSessionsDropped",
    "ArchiverLiveUnfollowed",
    "ArchiverLogInconsistent",
    "ArchiverLogLagging",
}
#: Recording rules that count a sharded, redundant fleet once (README, "Scaling and high availability").
EXPECTED_RECORDS = {
    "archiver:sessionhost_sessions:sum",
    "archiver:sessionhost_players:sum",
    "archiver:sessions_ended:rate5m",
    "archiver:shard_replicas_up:count",
}
# PromQL words that look like metric names but are not.
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                   "unless", "bool", "offset", "inf", "nan"}  # fmt: skip
GRAFANA_DURATIONS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
#: The matchers every dashboard series selector starts with (the rules file's: RULES_SELECTOR).
DASHBOARD_SCOPE = 'cluster=~"$cluster", namespace=~"$namespace", job=~"$job"'


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


def series_selectors(expr: str) -> list[tuple[str, str | None]]:
    """Each series selector of a PromQL expression: its metric name and its matchers (None when it
    has no braces); the same tokenising as metric_names."""
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    found: list[tuple[str, str | None]] = []
    for m in re.finditer(r'([A-Za-z_:][A-Za-z0-9_:]*)(\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})?', e):
        name = m.group(1)
        if m.start() and (e[m.start() - 1].isdigit() or e[m.start() - 1] in '.$"'):
            continue
        if name in {"le", "time"} or name.lower() in PROMQL_KEYWORDS or e[m.end() :].lstrip().startswith("("):
            continue
        found.append((name, m.group(2)[1:-1] if m.group(2) else None))
    return [(name, matchers) for name, matchers in found if name in metric_names(expr)]


def test_series_selector_extraction() -> None:
    expr = 'sum by (le) (rate(a_bucket{job="x", le=~"1.*"}[5m])) * on (job) group_left b_info and c{} > 5e3'
    assert series_selectors(expr) == [("a_bucket", 'job="x", le=~"1.*"'), ("b_info", None), ("c", "")]


def load_rules(kind: str = "alert") -> list[dict[str, Any]]:
    """The alerting rules of the rules file (or, with kind="record", its recording rules)."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if kind in rule]


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


def run_promtool(promtool: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, timeout=60, check=False)


def test_alert_rules_pass_promtool_check(promtool: str) -> None:
    result = run_promtool(promtool, "check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(EXPECTED_ALERTS) + len(EXPECTED_RECORDS)} rules found" in result.stdout


def test_alert_rules_unit_tests_pass(promtool: str) -> None:
    """Each alert fires on synthetic series and stays quiet otherwise (archiver.rules.test.yml)."""
    result = run_promtool(promtool, "test", "rules", RULES_TEST)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


# Each rule replaced by a plausible wrong one: the unit tests must notice.
BROKEN_RULES = {
    # Without the endpoint, the rule would also page for an account whose /metrics answers 404 for good.
    "ArchiverUpstreamDown": 'archiver_upstream_up{job="archiver"} == 0',
    "ArchiverItemsExpired": 'increase(archiver_items_total{job="archiver", outcome="archived"}[1h]) > 0',
    "ArchiverFetchDeadlineNear": 'archiver_next_fetch_deadline_timestamp_seconds{job="archiver"} - time() < 60',
    # The 0.1 rule: tied to a job name that contains "archiver", and silent without a target.
    "ArchiverDown/job-name": 'up{job=~".*archiver.*"} == 0',
    "ArchiverDown/no-absent": (
        'up{job="archiver"} == 0 and on (job, instance) max_over_time(archiver_build_info{job="archiver"}[1d])'
    ),
    "ArchiverStoreDown": 'archiver_store_up{job="archiver"} < 1 and archiver_store_up{job="archiver"} > 0',
    "ArchiverDetectionFailing": 'archiver_detection_up{job="archiver"} == 1',
    # A counter that stays up is not new invalid entries.
    "ArchiverUpstreamInvalidEntries": 'archiver_upstream_invalid_entries_total{job="archiver"} > 0',
    # Every way evidence is lost or in danger: a counter that stays up is no new loss, and a
    # neighbouring outcome, state, reason or guarantee is no loss at all.
    "ArchiverItemsFailed": 'archiver_items_total{job="archiver", outcome="failed"} > 0',
    "ArchiverItemsConflict": 'increase(archiver_items_total{job="archiver", outcome=~"conflict|source_gone"}[1h]) > 0',
    "ArchiverItemsTooLarge": 'archiver_items_total{job="archiver", outcome="too_large"} > 0',
    "ArchiverSessionsFailed": 'archiver_sessions_failed_total{job="archiver"} > 0',
    "ArchiverLiveCaptureGaps": 'increase(archiver_live_captures_total{job="archiver", state!="complete"}[1h]) > 0',
    "ArchiverLiveCaptureWriteFailed": 'increase(archiver_live_reconnects_total{job="archiver"}[15m]) > 0',
    "ArchiverCreateOnceEmulated": 'archiver_store_guarantee{job="archiver"} == 0',
    "ArchiverErrors": 'archiver_errors_total{job="archiver"} > 0',
}


def run_own_unit_tests(promtool: str, tmp_path: Path, rules: dict[str, Any], name: str) -> str:
    """promtool on ``rules`` with the unit tests that check rule ``name``: the test groups naming the
    alert, or whose expressions read the recording rule (each group runs in its own Prometheus, so a
    group's verdict does not depend on the others; one run of the whole file costs about a second).
    Returns the failures promtool reported of ``name`` itself (on stderr; empty: its tests passed)."""
    document = yaml.safe_load(RULES_TEST.read_text())
    document["tests"] = [
        group
        for group in document["tests"]
        if any(test["alertname"] == name for test in group.get("alert_rule_test", []))
        or any(name in test["expr"] for test in group.get("promql_expr_test", []))
    ]
    assert document["tests"], f"no unit test checks {name}"
    (tmp_path / RULES.name).write_text(yaml.safe_dump(rules))
    (tmp_path / RULES_TEST.name).write_text(yaml.safe_dump(document))
    result = run_promtool(promtool, "test", "rules", tmp_path / RULES_TEST.name)
    failures = re.findall(
        rf"^\s+(?:alertname: {re.escape(name)}|expr: \"[^\n]*{re.escape(name)}[^\n]*\"), time: .*$",
        result.stdout + result.stderr,
        re.M,
    )
    assert (result.returncode != 0) == bool(failures), result.stdout + result.stderr
    return "\n".join(failures)


def test_each_rules_own_unit_tests_pass(promtool: str, tmp_path: Path) -> None:
    """The selection the two tests below make is sound: each rule passes its own tests unbroken."""
    rules = yaml.safe_load(RULES.read_text())
    for name in [r.get("alert") or r["record"] for r in _rules()]:
        assert run_own_unit_tests(promtool, tmp_path, rules, name) == "", name


@pytest.mark.parametrize(("alert", "broken"), BROKEN_RULES.items(), ids=BROKEN_RULES.keys())
def test_alert_unit_tests_catch_a_broken_rule(promtool: str, tmp_path: Path, alert: str, broken: str) -> None:
    """The unit tests are not vacuous: a rule with a wrong expression fails its own tests."""
    document = yaml.safe_load(RULES.read_text())
    (rule,) = [r for g in document["groups"] for r in g["rules"] if r.get("alert") == alert.split("/")[0]]
    rule["expr"] = broken
    assert run_own_unit_tests(promtool, tmp_path, document, rule["alert"]), f"{alert}: its tests pass broken"


def _rules() -> list[dict[str, Any]]:
    return load_rules() + load_rules("record")


@pytest.mark.parametrize("rule", [r.get("alert") or r["record"] for r in _rules()])
def test_every_rule_selector_is_load_bearing(promtool: str, tmp_path: Path, rule: str) -> None:
    """Without its selector, each rule (alerting or recording) sees another release's series in the
    unit tests' shared Prometheus and fails its own tests: the tests prove every rule is scoped."""
    document = yaml.safe_load(RULES.read_text())
    (target,) = [r for g in document["groups"] for r in g["rules"] if rule in (r.get("alert"), r.get("record"))]
    unscoped = target["expr"].replace(f"{RULES_SELECTOR}, ", "").replace(f"{{{RULES_SELECTOR}}}", "")
    assert RULES_SELECTOR not in unscoped and unscoped != target["expr"]
    target["expr"] = unscoped
    assert run_own_unit_tests(promtool, tmp_path, document, rule), f"{rule}: its tests pass unscoped"


def test_every_series_selector_of_every_rule_carries_the_selector() -> None:
    """Mixin style: prometheusRule.selector is in every selector of every expression, so a release's
    rules never read, alert on, or record another release's series."""
    for rule in _rules():
        selectors = series_selectors(rule["expr"])
        assert selectors, rule
        for name, matchers in selectors:
            assert matchers is not None and matchers.startswith(RULES_SELECTOR), (
                rule.get("alert") or rule["record"],
                name,
            )


def test_alert_texts_name_namespace_and_pod_not_the_instance_alone() -> None:
    """Every alert's summary and description say where: namespace/pod when the ServiceMonitor's
    target labels are there, the instance only as a fallback (a plain scrape)."""
    where = "{{ if $labels.pod }}{{ $labels.namespace }}/{{ $labels.pod }}{{ else }}{{ $labels.instance }}{{ end }}"
    for rule in load_rules():
        annotations = rule["annotations"]
        for key in ("summary", "description"):
            assert where in annotations[key], (rule["alert"], key)
            if rule["alert"] != "ArchiverDown":  # whose texts test for a target: `if $labels.instance`
                assert annotations[key].replace(where, "").count("$labels.instance") == 0, (rule["alert"], key)


def test_a_release_rendered_by_the_chart_alerts_on_its_own_targets_only(promtool: str, tmp_path: Path) -> None:
    """The chart's rules for release games-evidence in namespace games (its ServiceMonitor's job and
    namespace, the default selector) under promtool: its store down and its target gone alert, with
    namespace and pod in the texts; the same failures of a release of the same name in another
    namespace do not; its fleet sum counts its own sessions only."""
    from tests.render_rules import chart_groups

    values = {"serviceMonitor": {"enabled": True}, "prometheusRule": {"selector": ""}}
    groups = chart_groups(values, release="games-evidence", namespace="games")
    (tmp_path / "release.rules.yml").write_text(yaml.safe_dump({"groups": groups}))
    job = "games-evidence-archiver"
    pod = f"{job}-0"
    ours = f'job="{job}", namespace="games", pod="{pod}", instance="10.0.0.1:9877"'
    theirs = f'job="{job}", namespace="staging", pod="{pod}", instance="10.0.0.2:9877"'
    fleet = 'shard="0", total_shards="1", replica="0"'
    sessions = 'location="eu", image="g", tag="1", status="running"'
    build = 'version="1", python_version="3.11"'
    # Both store down throughout; ours gone after minute 2, theirs running.
    tests = f"""
rule_files: [release.rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - {{series: 'archiver_store_up{{{ours}}}', values: 0x20}}
      - {{series: 'archiver_store_up{{{theirs}}}', values: 0x20}}
      - {{series: 'sessionhost_sessions{{{ours}, {sessions}}}', values: 7x20}}
      - {{series: 'sessionhost_sessions{{{theirs}, {sessions}}}', values: 900x20}}
      - {{series: 'archiver_shard_info{{{ours}, {fleet}}}', values: 1x20}}
      - {{series: 'archiver_shard_info{{{theirs}, {fleet}}}', values: 1x20}}
      - {{series: 'archiver_build_info{{{ours}, {build}}}', values: 1x2}}
      - {{series: 'archiver_build_info{{{theirs}, {build}}}', values: 1x30}}
    alert_rule_test:
      - eval_time: 10m
        alertname: ArchiverStoreDown
        exp_alerts:
          - exp_labels: {{severity: critical, job: {job}, namespace: games, pod: {pod}, instance: "10.0.0.1:9877"}}
            exp_annotations:
              runbook_url: {RUNBOOK_URL}#archiverstoredown
              summary: Archiver games/{pod} cannot write to its archive store
              description: >-
                games/{pod}: store operations and probes have failed for 5m. Fetched logs and artifacts wait
                in the local spool (nothing is lost while the volume has room), but no session is archived
                until the store accepts writes again.
      - eval_time: 15m
        alertname: ArchiverDown
        exp_alerts:
          - exp_labels: {{severity: critical, job: {job}, namespace: games}}
            exp_annotations:
              runbook_url: {RUNBOOK_URL}#archiverdown
              summary: "Archiver is not running in games: no target of job {job} exports archiver_build_info"
              description: >-
                No archiver has been scraped successfully for 5m. While the archiver is down, ended sessions
                are neither confirmed nor fetched; their logs and artifacts are removed upstream 4 hours
                after the session ends.
    promql_expr_test:
      - expr: archiver:sessionhost_sessions:sum
        eval_time: 1m
        exp_samples:
          - labels: 'archiver:sessionhost_sessions:sum{{job="{job}", namespace="games", {sessions}}}'
            value: 7
"""
    (tmp_path / "release.test.yml").write_text(tests)
    result = run_promtool(promtool, "test", "rules", tmp_path / "release.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def runbook_anchors() -> set[str]:
    """GitHub's anchors of the runbook's headings: lower-cased, spaces to -, punctuation dropped."""
    anchors = set()
    for line in RUNBOOK.read_text().splitlines():
        match = re.match(r"#{1,6}\s+(.+)", line)
        if match:
            anchors.add(re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-"))
    return anchors


def test_every_alert_is_documented() -> None:
    """The expected alerts exist, each with a severity, summary, description and a runbook_url whose
    anchor is a section of docs/runbook.md."""
    rules = load_rules()
    assert {r["alert"] for r in rules} == EXPECTED_ALERTS
    anchors = runbook_anchors()
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        for key in ("summary", "description", "runbook_url"):
            assert rule["annotations"].get(key, "").strip(), f"{rule['alert']} has no {key}"
        base, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert base == RUNBOOK_URL, rule["alert"]
        assert anchor in anchors, f"{rule['alert']}: no section #{anchor} in {RUNBOOK.name}"
    severities = {r["alert"]: r["labels"]["severity"] for r in rules}
    assert severities["ArchiverItemsExpired"] == "critical"
    assert severities["ArchiverStoreDown"] == "critical"
    for lost in ("ArchiverItemsFailed", "ArchiverItemsConflict", "ArchiverSessionsFailed"):
        assert severities[lost] == "critical", lost


def test_runbook_anchor_check_is_live() -> None:
    """The anchor check above can fail: headings give GitHub's anchors, and a made-up one is missing."""
    anchors = runbook_anchors()
    assert {"archiverdown", "archiverstoredown"} <= anchors
    assert "archiverstoredwon" not in anchors


def test_alert_expressions_use_only_design_metric_names() -> None:
    for rule in load_rules():
        names = metric_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= KNOWN_METRICS, f"{rule['alert']}: unknown {names - KNOWN_METRICS}"


def test_recording_rules_count_the_fleet_from_design_metric_names() -> None:
    records = load_rules("record")
    assert {r["record"] for r in records} == EXPECTED_RECORDS
    for rule in records:
        names = metric_names(rule["expr"])
        assert "archiver_shard_info" in names, rule["record"]
        assert names <= KNOWN_METRICS | {"up"}, f"{rule['record']}: unknown {names - KNOWN_METRICS}"


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
    """Every archiver_* series the dashboards and alerts query is one archiver.selfmetrics exposes
    or one of the exposition's snapshot gauges."""
    exposed = exposed_names(self_metrics_registry()) | {f.full_name() for f in FAMILIES}
    used = {name for name in used_metric_names() if name.startswith("archiver_")}
    assert used <= exposed, used - exposed


def test_store_up_is_absent_until_set_then_follows_the_last_outcome() -> None:
    """archiver_store_up: no series before the first store operation (export-only mode must not look
    like a store outage), then 1 or 0 as the latest operation or probe went."""
    from prometheus_client import CollectorRegistry

    from archiver.metrics.selfmetrics import SelfMetrics

    registry = CollectorRegistry()
    metrics = SelfMetrics(registry)
    assert registry.get_sample_value("archiver_store_up") is None
    metrics.set_store_up(True)
    assert registry.get_sample_value("archiver_store_up") == 1.0
    metrics.set_store_up(False)
    assert registry.get_sample_value("archiver_store_up") == 0.0
    assert b"# TYPE archiver_store_up gauge" in metrics.render(openmetrics=False)


def test_upstream_requests_use_the_poll_metrics_endpoint_names() -> None:
    """One `endpoint` vocabulary: every request name the API client reports maps to a short name,
    and the polled ones are the names archiver_upstream_up uses."""
    from prometheus_client import CollectorRegistry

    from archiver.exporter.poller import ENDPOINTS
    from archiver.metrics.selfmetrics import ENDPOINT_LABELS, SelfMetrics

    source = (REPO / "archiver" / "upstream" / "api.py").read_text()
    request_names = set(re.findall(r'"((?:GET|POST|PUT|DELETE|PATCH|HEAD) /[^"]*)"\)?', source))
    request_names = {n for n in request_names if n.count(" ") == 1}
    assert request_names and request_names <= ENDPOINT_LABELS.keys(), request_names - ENDPOINT_LABELS.keys()
    assert {ENDPOINT_LABELS["GET /session"], ENDPOINT_LABELS["GET /metrics"]} == set(ENDPOINTS)
    assert len(set(ENDPOINT_LABELS.values())) == len(ENDPOINT_LABELS)
    registry = CollectorRegistry()
    metrics = SelfMetrics(registry)
    metrics.upstream_request("GET /session", 200)
    metrics.poll_result("sessions", ok=True, duration=0.01, now=1.0)
    labels = {"endpoint": "sessions"}
    assert registry.get_sample_value("archiver_upstream_requests_total", {**labels, "code": "200"}) == 1.0
    assert registry.get_sample_value("archiver_upstream_up", labels) == 1.0


def test_dashboards_cover_the_pipeline_and_fleet_metrics() -> None:
    """The panels asked for exist: every metric is charted except the per-session details and the
    few listed here (diagnostics read from /metrics or by alerts, not worth a panel)."""
    used = set()
    for path in DASHBOARDS:
        for expr in dashboard_exprs(json.loads(path.read_text())):
            used |= metric_names(expr)
    assert used >= KNOWN_METRICS - NOT_CHARTED, KNOWN_METRICS - NOT_CHARTED - used


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
def test_every_dashboard_query_is_scoped_by_cluster_namespace_and_job(path: Path) -> None:
    """A shared Prometheus holds other teams' releases and, behind Thanos or Mimir, other clusters:
    every series selector of every panel and variable query starts with the cluster, namespace and
    job matchers (the variables chain in that order), and joins and per-release groupings keep
    cluster and namespace apart."""
    board = json.loads(path.read_text())
    variables = [v for v in board["templating"]["list"] if v["type"] == "query"]
    assert [v["name"] for v in variables][:4] == ["cluster", "namespace", "job", "instance"]
    chained = {"cluster": "", "namespace": 'cluster=~"$cluster"', "job": 'cluster=~"$cluster", namespace=~"$namespace"'}
    for var in variables:
        query = var["query"]["query"]
        assert var["definition"] == query
        match = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
        assert match, query
        ((_, matchers),) = series_selectors(match.group(1))
        if var["name"] in chained:
            assert (matchers or "") == chained[var["name"]], query
        else:
            assert matchers and matchers.startswith(DASHBOARD_SCOPE), query
    for panel in all_panels(board):
        for target in panel.get("targets", []):
            selectors = series_selectors(target["expr"])
            assert selectors, target["expr"]
            for name, matchers in selectors:
                assert matchers is not None and matchers.startswith(DASHBOARD_SCOPE), (panel["title"], name)
            for clause in re.findall(r"\b(?:on|by)\s*\(([^)]*)\)", target["expr"]):
                labels = [label.strip() for label in clause.split(",")]
                if "job" in labels:
                    assert labels[:3] == ["cluster", "namespace", "job"], (panel["title"], clause)


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_scope_variables_match_everything_when_all_is_selected(path: Path) -> None:
    """cluster, namespace and job default to All, whose value .* also matches series that lack the
    label (a single-cluster Prometheus has no cluster label; a plain scrape no namespace)."""
    board = json.loads(path.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    for name in ("cluster", "namespace", "job", "instance"):
        var = variables[name]
        assert var["includeAll"] is True and var["allValue"] == ".*" and var["multi"] is True, name
        assert var["current"] == {} and var["refresh"] == 2, name


def test_the_all_value_matches_series_without_the_label(promtool: str, tmp_path: Path) -> None:
    """What the All value relies on, checked by Prometheus' own engine: `=~".*"` selects a series
    without that label, so the dashboards work before anyone adds a cluster label."""
    (tmp_path / "empty.rules.yml").write_text("groups: []\n")
    tests = {
        "rule_files": ["empty.rules.yml"],
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": 'archiver_build_info{job="archiver", instance="a:9877"}', "values": "1x5"},
                    {
                        "series": 'archiver_build_info{cluster="eu1", namespace="games", job="other", instance="b"}',
                        "values": "1x5",
                    },
                ],
                "promql_expr_test": [
                    {
                        "expr": 'count(archiver_build_info{cluster=~".*", namespace=~".*", job=~".*"})',
                        "eval_time": "2m",
                        "exp_samples": [{"labels": "{}", "value": 2}],
                    },
                    {
                        "expr": 'count(archiver_build_info{cluster=~"eu1", namespace=~".*", job=~".*"})',
                        "eval_time": "2m",
                        "exp_samples": [{"labels": "{}", "value": 1}],
                    },
                ],
            }
        ],
    }
    (tmp_path / "all.test.yml").write_text(yaml.safe_dump(tests))
    result = run_promtool(promtool, "test", "rules", tmp_path / "all.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_dashboard_structure(path: Path) -> None:
    """Grafana 10 JSON: schemaVersion 39, unique ids, the datasource/cluster/namespace/job/instance
    variables, every query on ${datasource}, and no two panels overlapping on the grid."""
    board = json.loads(path.read_text())
    assert board["schemaVersion"] == 39
    assert board["uid"] and board["title"] and board["id"] is None
    panels = all_panels(board)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids in {path.name}"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"cluster", "namespace", "job", "instance"} <= variables.keys()
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


def test_chart_rules_with_custom_settings_pass_promtool_check(promtool: str, tmp_path: Path) -> None:
    """Thresholds, windows and `for` set from chart values still make valid rules (the template is
    the source of the rules file, so a value that breaks the PromQL must not slip through)."""
    from tests.render_rules import chart_groups

    settings = {
        "ArchiverUpstreamInvalidEntries": {"window": "30m", "for": "5m"},
        "ArchiverFetchDeadlineNear": {"threshold": 2700.5, "for": ""},
        "ArchiverItemsExpired": {"window": "6h", "severity": "warning"},
        "ArchiverUploadBacklog": {"threshold": 1000},
        "ArchiverSpoolLarge": {"volumeFraction": 0.9},
        "ArchiverNoRecentArchive": {"threshold": 7200},
        "ArchiverSessionsDropped": {"enabled": False},
    }
    groups = chart_groups({"persistence": {"size": "200Gi"}, "prometheusRule": {"rules": settings}})
    rules_file = tmp_path / "custom.rules.yml"
    rules_file.write_text(yaml.safe_dump({"groups": groups}))
    result = run_promtool(promtool, "check", "rules", rules_file)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(EXPECTED_ALERTS) - 1 + len(EXPECTED_RECORDS)} rules found" in result.stdout
    rules = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    assert (
        rules["ArchiverSpoolLarge"]["expr"] == f"archiver_spool_bytes{{{RULES_SELECTOR}}} > {int(0.9 * 200 * 1024**3)}"
    )
    assert (
        rules["ArchiverFetchDeadlineNear"]["expr"].endswith("< 2700")
        and "for" not in rules["ArchiverFetchDeadlineNear"]
    )


#: What a pipeline dashboard panel counts per archive (sessions, items, captures, captured lines):
#: every replica of a shard counts the same ones, so a panel adding them up over pods double counts.
PER_ARCHIVE_METRICS = frozenset(
    {
        "archiver_items_total",
        "archiver_pending_items",
        "archiver_sessions_ended_total",
        "archiver_live_captures_total",
        "archiver_live_lines_total",
        "archiver_live_bytes_total",
    }
)


def _fleet_series(job: str, pods: list[tuple[int, int]], total_shards: int) -> list[dict[str, str]]:
    """Series of one fleet: pods as (shard, replica); shard s's counters grow by s + 2 per minute
    (each item kind and outcome, stage, capture state), and its replicas export the same values.
    A 1-shard fleet (`single`) gets the sum of both shards of the 2-shard one."""
    series = []
    for number, (shard, replica) in enumerate(pods):
        where = f'job="{job}", namespace="games", instance="{job}-{number}:9877"'
        series.append(
            {
                "series": f'archiver_shard_info{{{where}, shard="{shard}", total_shards="{total_shards}", '
                f'replica="{replica}"}}',
                "values": "1x60",
            }
        )
        step = 5 if total_shards == 1 else shard + 2  # 5 = 2 + 3: both shards' sessions
        items = [(kind, outcome) for kind in ("logs", "artifact") for outcome in ("archived", "expired")]
        counters = [
            *(f'archiver_items_total{{{where}, kind="{k}", outcome="{o}"}}' for k, o in items),
            f"archiver_sessions_ended_total{{{where}}}",
            *(f'archiver_live_captures_total{{{where}, state="{s}"}}' for s in ("complete", "gap")),
            f"archiver_live_lines_total{{{where}}}",
            f"archiver_live_bytes_total{{{where}}}",
        ]
        series += [{"series": name, "values": f"0+{step}x60"} for name in counters]
        series += [
            {"series": f'archiver_pending_items{{{where}, stage="{s}"}}', "values": f"{step * 3}x60"}
            for s in ("fetch", "upload")
        ]
    return series


def test_pipeline_dashboard_counts_each_archive_once_whatever_the_replica_count(promtool: str, tmp_path: Path) -> None:
    """Every pipeline panel that counts sessions, items or captures reads the same for one pod as for
    2 shards x 2 redundant replicas of the same sessions (Prometheus' engine evaluates each panel's
    query for both fleets); summing over pods, as before, shows the redundant fleet twice."""
    board = json.loads((REPO / "grafana" / "dashboards" / "archiver.json").read_text())
    queries = [e for e in dashboard_exprs(board) if metric_names(e) & PER_ARCHIVE_METRICS]
    assert len(queries) >= 10, queries
    rules, checks = [], []
    for number, expr in enumerate(queries):
        for var, duration in GRAFANA_DURATIONS.items():
            expr = expr.replace(var, duration)
        for fleet in ("single", "redundant"):
            query = re.sub(r"\$\{?\w+\}?", ".*", expr.replace("$job", fleet))
            rules.append({"record": f"panel:q{number}:{fleet}", "expr": query})
        single, redundant = f"panel:q{number}:single", f"panel:q{number}:redundant"
        # 1 when both fleets give the same series with the same values (and some is not 0).
        same = (
            f"count(abs({single} - {redundant}) < 1e-9) / count({single})"
            f" * count({single}) / count({redundant}) * (max({single}) > bool 0)"
        )
        checks.append({"expr": same, "eval_time": "40m", "exp_samples": [{"labels": "{}", "value": 1}]})
    (tmp_path / "panels.rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    redundant_pods = [(0, 0), (0, 1), (1, 0), (1, 1)]
    tests = {
        "rule_files": ["panels.rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": _fleet_series("single", [(0, 0)], 1) + _fleet_series("redundant", redundant_pods, 2),
                "promql_expr_test": checks,
            }
        ],
    }
    (tmp_path / "panels.test.yml").write_text(yaml.safe_dump(tests))
    result = run_promtool(promtool, "test", "rules", tmp_path / "panels.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
