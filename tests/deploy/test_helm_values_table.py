"""The chart README's values table is generated from values.yaml's helm-docs comments, complete and current."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest
import yaml

from tests.values_table import README, VALUES, Row, ValuesDocError, parse_docs, render_readme, render_table, rows

SCHEMA = json.loads((README.parent / "values.schema.json").read_text())


def _leaf_paths(values: dict[str, Any], prefix: str = "") -> set[str]:
    paths = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        paths.add(path)
        if isinstance(value, dict):
            paths |= _leaf_paths(value, f"{path}.")
    return paths


def test_readme_values_table_is_generated_from_values_yaml() -> None:
    """Fix: python -m tests.values_table."""
    assert README.read_text() == render_readme(README.read_text(), VALUES.read_text())


def test_every_value_has_a_row_with_a_description() -> None:
    """Complete: every key of values.yaml is a row or inside a documented map's row, and every row
    says what the value does."""
    values = yaml.safe_load(VALUES.read_text())
    table = rows(values, parse_docs(VALUES.read_text()))
    undocumented = [row.key for row in table if not row.description]
    assert undocumented == []
    keys = {row.key for row in table}
    for path in _leaf_paths(values):
        assert (
            path in keys or any(path.startswith(f"{k}.") for k in keys) or any(k.startswith(f"{path}.") for k in keys)
        ), path


def test_the_table_lists_every_key_the_schema_allows() -> None:
    """values.schema.json and values.yaml agree: no key the schema allows lacks a default (and a row),
    so the table documents everything a user may set, config keys included. (Maps documented as one
    row, Kubernetes objects such as probes, keep their own fields to the API server.)"""
    values = yaml.safe_load(VALUES.read_text())
    documented = parse_docs(VALUES.read_text())

    def schema_paths(schema: dict[str, Any], prefix: str = "") -> set[str]:
        paths = set()
        for key, sub in schema.get("properties", {}).items():
            path = f"{prefix}{key}"
            paths.add(path)
            if path not in documented and isinstance(values_at(path), dict):
                paths |= schema_paths(sub, f"{path}.")
        return paths

    def values_at(path: str) -> Any:
        node: Any = values
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    assert schema_paths(SCHEMA) - _leaf_paths(values) == set()


def test_generator_follows_helm_docs_rules() -> None:
    """`# --` starts a description that the comment lines below it continue; comments above it are
    ignored; `(type)` and `@default` override; a documented map is one row; an undocumented one is
    broken down; `|` and `<tag>` are escaped outside code spans."""
    text = textwrap.dedent(
        """\
        # A section heading, not a description.
        # -- Replicas | count
        # of <pods>, see `<x>`.
        replicas: 1
        image:
          # -- (string) Tag; empty is appVersion.
          # @default -- the chart's appVersion
          tag: null
        # -- Resources.
        resources:
          limits:
            memory: 1Gi
        list:
          - name: a
            value: b
        """
    ).replace("list:", "# -- A list.\nlist:")
    assert rows(yaml.safe_load(text), parse_docs(text)) == [
        Row("replicas", "int", "`1`", "Replicas | count of <pods>, see `<x>`."),
        Row("image.tag", "string", "`the chart's appVersion`", "Tag; empty is appVersion."),
        Row("resources", "object", '`{"limits":{"memory":"1Gi"}}`', "Resources."),
        Row("list", "list", '`[{"name":"a","value":"b"}]`', "A list."),
    ]
    table = render_table(text)
    assert "| replicas | int | `1` | Replicas \\| count of &lt;pods>, see `<x>`. |" in table


def test_a_documented_map_with_documented_keys_is_refused() -> None:
    text = "# -- All of it.\nbrowser:\n  # -- Lost in the map's row.\n  port: 1\n"
    with pytest.raises(ValuesDocError, match=r"browser\.port"):
        rows(yaml.safe_load(text), parse_docs(text))


def test_drift_is_detected() -> None:
    """The README check above is live: a changed description changes the rendered README."""
    changed = VALUES.read_text().replace("# -- Container image repository", "# -- The image repository", 1)
    assert changed != VALUES.read_text()
    assert render_readme(README.read_text(), changed) != README.read_text()
