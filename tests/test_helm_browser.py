"""The chart's `browser.enabled`: a read-only second container serving `archiver browse`, its port and policy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest

from tests.support import ALL_FEATURES, CHART, CRD_SCHEMAS, K8S_VERSIONS, MINIMAL, Doc, one, render
from tests.support import CHART_TOKEN as TOKEN


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def _containers(docs: list[Doc]) -> dict[str, Doc]:
    return {c["name"]: c for c in one(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"]}


def _with_browser(values: dict[str, Any], **browser: Any) -> dict[str, Any]:
    return {**values, "browser": {"enabled": True, **browser}}


def test_the_browser_is_off_by_default(chart: helm.Chart) -> None:
    docs = render(chart, MINIMAL)
    assert list(_containers(docs)) == ["archiver"]
    assert [p["name"] for p in one(docs, "Service")["spec"]["ports"]] == ["http-metrics"]


def test_browser_enabled_adds_a_read_only_container_and_a_service_port(chart: helm.Chart) -> None:
    """The browser runs `archiver browse` with the daemon's config and web config, never the token or state."""
    docs = render(chart, _with_browser(ALL_FEATURES, port=9900))
    browser = _containers(docs)["browser"]
    args = browser["args"]
    assert args[:5] == ["browse", "--config", "/etc/archiver/config.toml", "--listen", "0.0.0.0:9900"]
    assert args[args.index("--web-config-file") + 1] == "/etc/archiver/web/web-config.yml"
    assert "--api-token-file" not in args
    mounts = {m["name"] for m in browser["volumeMounts"]}
    assert {"config", "web-config", "tmp"} <= mounts and not {"api-token", "state"} & mounts
    assert browser["ports"] == [{"name": "http-browser", "containerPort": 9900, "protocol": "TCP"}]
    assert browser["readinessProbe"]["tcpSocket"] == {"port": "http-browser"}
    service_ports = {p["name"]: p for p in one(docs, "Service")["spec"]["ports"]}
    assert service_ports["http-browser"]["port"] == 9900
    # The ServiceMonitor still scrapes only the metrics port.
    assert [e["port"] for e in one(docs, "ServiceMonitor")["spec"]["endpoints"]] == ["http-metrics"]
    assert TOKEN not in str(browser)


def test_network_policy_opens_the_browser_port_to_its_own_peers(chart: helm.Chart) -> None:
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}}}]
    values = _with_browser({**MINIMAL, "networkPolicy": {"enabled": True}}, ingressFrom=peers)
    rules = one(render(chart, values), "NetworkPolicy")["spec"]["ingress"]
    assert rules[1] == {"ports": [{"port": "http-browser", "protocol": "TCP"}], "from": peers}


def test_manifests_with_the_browser_validate_against_kubernetes_schemas(chart: helm.Chart) -> None:
    values = _with_browser({**ALL_FEATURES, "networkPolicy": {"enabled": True}})
    for doc in render(chart, values):
        crd_schema = CRD_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
        if crd_schema is not None:
            jsonschema.validate(doc, crd_schema)
            continue
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def test_a_misspelt_browser_key_is_refused(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmError, match="additional properties 'enabeld' not allowed"):
        render(chart, {**MINIMAL, "browser": {"enabeld": True}})
