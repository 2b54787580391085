"""The README stays a short, true user manual: two Quick start commands, a size limit, links that
resolve; the reference pages it links to (docs/configuration.md, docs/metrics.md) in sync with the
code."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from archiver.cli.base import main
from archiver.config.command_options import COMMAND_OPTIONS
from archiver.config.options import option_table
from archiver.exporter.families import FAMILIES
from archiver.metrics.selfmetrics import SelfMetrics

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
#: The reference pages the README links to for its tables.
CONFIGURATION = (REPO / "docs" / "configuration.md").read_text()
METRICS = (REPO / "docs" / "metrics.md").read_text()


def section(title: str, text: str = README) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"no '## {title}' section"
    return match.group(1)


def test_quick_start_has_exactly_the_demo_and_test_commands() -> None:
    block = re.search(r"```sh\n(.*?)```", section("Quick start"), re.S)
    assert block
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.split("#")[0].strip()]
    assert commands == ["make demo", "make test"]


def test_configuration_table_matches_the_option_table() -> None:
    """docs/configuration.md's table of the daemon's options is the option table, row for row."""
    rows = re.findall(r"^\| `(--[a-z0-9.-]+)` \| `([A-Z0-9_]+)` \| `([^`]*)` \| (.*?) \|$", CONFIGURATION, re.M)
    assert rows == [(flag, env, default, text) for flag, env, default, text in option_table()]


def test_command_options_table_matches_the_command_tables() -> None:
    """docs/configuration.md's table of `browse`, `demo`, `fake-service` and `grep` options is their option tables."""
    rows = re.findall(
        r"^\| `([a-z-]+)` \| `(--[a-z0-9.-]+)` \| `([A-Z0-9_]+)` \| `([^`]*)` \| (.*?) \|$", CONFIGURATION, re.M
    )
    assert rows == [
        (command, opt.flag, opt.env, opt.shown_default, opt.help)
        for command, table in COMMAND_OPTIONS.items()
        for opt in table
    ]


def test_every_run_option_in_help_is_documented_and_vice_versa() -> None:
    """`run --help` says what docs/configuration.md's table says: each row's help text, env var and default."""
    result = CliRunner().invoke(main, ["run", "--help"], terminal_width=200)
    assert result.exit_code == 0
    in_help = set(re.findall(r"^\s+(--[a-z0-9.-]+)", result.output, re.M)) - {"--help", "--config"}
    documented = {flag for flag, *_ in option_table()}
    assert in_help == documented
    flat = " ".join(result.output.split())  # click wraps lines: compare with whitespace collapsed
    for flag, env, default, text in option_table():
        shown = f"[env var: {env}; default: {default}]" if default != "(none)" else f"[env var: {env}]"
        assert f" {text} {shown}" in flat, f"{flag}: --help does not say {text} {shown}"


def metric_rows() -> dict[str, tuple[str, set[str]]]:
    """docs/metrics.md's tables: name → (type, label names), label values in parentheses left out."""
    rows = {}
    for name, kind, labels in re.findall(r"^\| `([a-z_<>]+)` \|([^|]+)\|([^|]*)\|", METRICS, re.M):
        rows[name] = (kind.strip(), set(re.findall(r"`([^`]+)`", re.sub(r"\([^)]*\)", "", labels))))
    return rows


def test_every_exposition_family_is_documented_with_its_type_and_labels() -> None:
    """archiver.exposition.FAMILIES and docs/metrics.md's tables say the same: name, type, labels."""
    rows = metric_rows()
    for family in FAMILIES:
        kind = family.type + (" (1)" if family.value_one else "")
        assert rows.get(family.full_name()) == (kind, set(family.labels)), family.name
    documented = {name for name in rows if name.startswith("sessionhost_") and "<name>" not in name}
    assert documented == {f.full_name() for f in FAMILIES if f.prefixed}


def test_every_self_metric_is_documented_with_its_type_and_labels() -> None:
    """Every family the SelfMetrics registry exposes has its docs/metrics.md row, and every archiver_* row
    is either a self metric or one of the exposition's snapshot gauges."""
    registry = CollectorRegistry()
    metrics = SelfMetrics(registry)
    # Gauges absent until first set: set them, so every family is collected.
    metrics.set_next_fetch_deadline(1_700_000_000.0)
    metrics.set_store_up(True)
    rows = metric_rows()
    names = set()
    for family in registry.collect():
        name = f"{family.name}_total" if family.type == "counter" else family.name
        names.add(name)
        assert name in rows, name
        kind, labels = rows[name]
        assert kind.split(" ")[0] == family.type, name
        sampled = {label for sample in family.samples for label in sample.labels} - {"le"}
        assert sampled <= labels, (name, sampled - labels)
    snapshot = {f.full_name() for f in FAMILIES if not f.prefixed}
    own = {name for name in names if name.startswith("archiver_")}
    assert {name for name in rows if name.startswith("archiver_")} == own | snapshot
    # The rest is the process's own (process_*, python_*): exactly those rows.
    assert {name for name in rows if name.startswith(("process_", "python_"))} == names - own


def test_the_alert_table_states_each_alerts_default_severity_and_every_alert_is_named() -> None:
    """The README's alert table says what the chart's defaults do (severity, the `for` it names),
    and the section names every alert the chart can render."""
    text = section("Dashboards and alerts")
    values = yaml.safe_load((REPO / "helm/archiver/values.yaml").read_text())
    rules = values["prometheusRule"]["rules"]
    rows = re.findall(r"^\| `(Archiver\w+)` \| (.*?) \| (critical|warning) \|$", text, re.M)
    assert len(rows) >= 10
    for name, meaning, severity in rows:
        assert name in rules, name
        assert severity == rules[name]["severity"], name
        if rules[name].get("for") == "15m":
            assert "15 min" in meaning, name
    named = set(re.findall(r"`(Archiver[A-Z]\w+)`", text))
    assert named == set(rules), set(rules) ^ named


#: The project's limit on the README: a user manual; deep topics are pages under docs/.
README_LIMIT_BYTES = 48_000


def test_the_readme_stays_a_manual_within_its_size_limit() -> None:
    size = len(README.encode())
    assert size <= README_LIMIT_BYTES, f"README.md is {size} bytes: move a deep topic to a page under docs/"


#: The Markdown files whose relative links and anchors must resolve.
LINKED_PAGES = (
    "README.md",
    "RELIABILITY.md",
    "ARCHITECTURE.md",
    "CHANGELOG.md",
    "helm/archiver/README.md",
    "benchmarks/RESULTS.md",
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")),
)


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (lower-cased, punctuation dropped, spaces to -,
    a repeated heading numbered) and of its explicit `<a id=...>` / `<a name=...>` tags."""
    text = re.sub(r"(?ms)^```.*?^```", "", path.read_text(encoding="utf-8"))
    found: set[str] = set(re.findall(r"""<a (?:id|name)=["']([^"']+)["']""", text))
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def broken_links(path: Path) -> list[str]:
    """The relative links of a Markdown file (code blocks left out) whose file or anchor is missing."""
    text = re.sub(r"(?ms)^```.*?^```", "", path.read_text(encoding="utf-8"))
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto: and the like
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        missing_heading = anchor and resolved.suffix == ".md" and resolved.exists() and anchor not in anchors(resolved)
        if not resolved.exists() or missing_heading:
            broken.append(target)
    return broken


def test_every_relative_link_of_the_docs_reaches_its_file_and_heading() -> None:
    """README ↔ docs/, the chart README, ARCHITECTURE.md, RELIABILITY.md: no link points at a moved
    page or a heading that is gone."""
    broken = {page: links for page in LINKED_PAGES if (links := broken_links(REPO / page))}
    assert not broken, broken


def test_the_link_check_finds_a_missing_page_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## A `code` heading\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#a-code-heading) [ok](other.md#twice-1) [ok](#here) [web](https://example.com/x#y)\n"
        "[gone](missing.md) [no heading](other.md#nowhere)\n\n## Here\n\n```\n[in code](missing-too.md)\n```\n"
    )
    assert broken_links(page) == ["missing.md", "other.md#nowhere"]
