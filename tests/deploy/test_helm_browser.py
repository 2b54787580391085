"""The chart's evidence browser: its Deployment, Service, credentials, Ingress and URL, and the dashboards' links."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

from archiver.browse.app import BrowseApp
from archiver.browse.urls import mount
from archiver.store import open_store
from tests.support import (
    ALL_FEATURES,
    BROWSER_INGRESS,
    CHART,
    MINIMAL,
    Doc,
    one,
    render,
    validate_manifests,
)
from tests.support import CHART_TOKEN as TOKEN

STORE = {**MINIMAL["config"], "store": "s3://archive-bucket/sessions/"}
WITH_STORE = {**MINIMAL, "config": STORE}
CONFIG_FILE = "/etc/archiver/config.toml"
WEB_CONFIG_FILE = "/etc/archiver/web/web-config.yml"
OAUTH2_PROXY = {
    "nginx.ingress.kubernetes.io/auth-url": "https://oauth2.example.com/oauth2/auth",
    "nginx.ingress.kubernetes.io/auth-signin": "https://oauth2.example.com/oauth2/start?rd=$escaped_request_uri",
}
BCRYPT_USERS = {"support": "$2y$10$abcdefghijklmnopqrstuv"}
DASHBOARD_SOURCES = {p.name: p.read_text() for p in (CHART.parent.parent / "grafana" / "dashboards").glob("*.json")}


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def _with_browser(values: dict[str, Any], **browser: Any) -> dict[str, Any]:
    return {**values, "browser": {"enabled": True, **browser}}


def _ingress(**ingress: Any) -> dict[str, Any]:
    return {"enabled": True, "hosts": ["evidence.example.com"], "annotations": OAUTH2_PROXY, **ingress}


def _browser_pod(docs: list[Doc]) -> Doc:
    pod: Doc = one(docs, "Deployment")["spec"]["template"]
    return pod


def _browser(docs: list[Doc]) -> Doc:
    (found,) = _browser_pod(docs)["spec"]["containers"]
    assert found["name"] == "browser"
    return found


def _flag(args: list[str], flag: str) -> str:
    value: str = args[args.index(flag) + 1]
    return value


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def _browser_urls(docs: list[Doc]) -> dict[str, str]:
    """Each dashboard ConfigMap's browser_url default (its query, current value and only option)."""
    urls = {}
    for cm in docs:
        if cm["kind"] != "ConfigMap" or "grafana_dashboard" not in cm["metadata"]["labels"]:
            continue
        ((name, body),) = cm["data"].items()
        (variable,) = [v for v in json.loads(body)["templating"]["list"] if v["name"] == "browser_url"]
        assert variable["current"]["value"] == variable["current"]["text"] == variable["query"], name
        assert [o["value"] for o in variable["options"]] == [variable["query"]], name
        urls[name] = variable["query"]
    return urls


def test_the_browser_is_off_by_default(chart: helm.Chart) -> None:
    docs = render(chart, MINIMAL)
    assert not [d for d in docs if d["kind"] in ("Deployment", "Ingress")]
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Service"] == ["arch-archiver"]
    assert [p["name"] for p in one(docs, "Service")["spec"]["ports"]] == ["http-metrics"]


def test_the_browser_is_its_own_deployment_and_no_longer_a_sidecar(chart: helm.Chart) -> None:
    """The archiver pod has one container; the browser runs `archiver browse` in a Deployment of its
    own with its own Service, so an archiver failing /readyz takes no browser page down. It gets the
    config and web config, never the token or the state volume, and the archiver's locked-down pod."""
    docs = render(chart, _with_browser(ALL_FEATURES, port=9900, replicas=2))
    sts_pod = one(docs, "StatefulSet")["spec"]["template"]["spec"]
    assert [c["name"] for c in sts_pod["containers"]] == ["archiver"]
    deployment = one(docs, "Deployment")
    assert deployment["metadata"]["name"] == "arch-archiver-browser"
    assert deployment["spec"]["replicas"] == 2
    browser = _browser(docs)
    # TLS in the (inherited) web config: the in-cluster URL is https.
    assert browser["args"] == [
        "browse",
        "--config",
        CONFIG_FILE,
        "--web.listen-address",
        "0.0.0.0:9900",
        "--web.external-url",
        "https://arch-archiver-browser.observability.svc:9900",
        "--web.config.file",
        WEB_CONFIG_FILE,
    ]
    assert browser["image"] == sts_pod["containers"][0]["image"]
    env = {e["name"]: e for e in browser["env"]}
    assert env["ARCHIVER_CONFIG"]["value"] == CONFIG_FILE
    assert not {"ARCHIVER_API_TOKEN", "ARCHIVER_API_TOKEN_FILE"} & env.keys()
    mounts = {m["name"] for m in browser["volumeMounts"]}
    assert {"config", "web-config", "tmp", "tls"} <= mounts and not {"api-token", "state"} & mounts
    assert TOKEN not in json.dumps(deployment)
    assert browser["ports"] == [{"name": "http-browser", "containerPort": 9900, "protocol": "TCP"}]
    for probe in ("livenessProbe", "readinessProbe"):
        assert browser[probe]["httpGet"] == {"path": "/healthz", "port": "http-browser", "scheme": "HTTPS"}
    assert browser["securityContext"] == sts_pod["containers"][0]["securityContext"]
    pod = _browser_pod(docs)["spec"]
    assert pod["securityContext"] == sts_pod["securityContext"]
    assert pod["automountServiceAccountToken"] is False
    service = one(docs, "Service", "arch-archiver-browser")
    assert service["spec"]["ports"] == [
        {"name": "http-browser", "port": 9900, "targetPort": "http-browser", "protocol": "TCP"}
    ]
    assert [p["name"] for p in one(docs, "Service", "arch-archiver")["spec"]["ports"]] == ["http-metrics"]
    validate_manifests(docs)


def test_archiver_and_browser_selectors_never_cross(chart: helm.Chart) -> None:
    """The browser pods share the name and instance labels, so every selector of archiver pods adds
    the component: the metrics Service, PDB, NetworkPolicy and spread never pick a browser pod, the
    browser's Service and policy never an archiver pod, and the archiver's ServiceMonitor scrapes the
    metrics Service only (the browser's, its own Service only)."""
    values = _with_browser({**ALL_FEATURES, "shards": 2}, ingressFrom=[{"podSelector": {}}])
    docs = render(chart, values)
    archiver_pod = one(docs, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    browser_pod = _browser_pod(docs)["metadata"]["labels"]
    archiver_selectors = [
        one(docs, "Service", "arch-archiver")["spec"]["selector"],
        one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
        one(docs, "NetworkPolicy", "arch-archiver")["spec"]["podSelector"]["matchLabels"],
        one(docs, "StatefulSet")["spec"]["template"]["spec"]["topologySpreadConstraints"][0]["labelSelector"][
            "matchLabels"
        ],
    ]
    for selector in archiver_selectors:
        assert _selects(selector, archiver_pod) and not _selects(selector, browser_pod), selector
    for selector in (
        one(docs, "Service", "arch-archiver-browser")["spec"]["selector"],
        one(docs, "NetworkPolicy", "arch-archiver-browser")["spec"]["podSelector"]["matchLabels"],
        one(docs, "Deployment")["spec"]["selector"]["matchLabels"],
    ):
        assert _selects(selector, browser_pod) and not _selects(selector, archiver_pod), selector
    monitor = one(docs, "ServiceMonitor", "arch-archiver")["spec"]
    assert [e["port"] for e in monitor["endpoints"]] == ["http-metrics"]
    archiver_service = one(docs, "Service", "arch-archiver")["metadata"]["labels"]
    assert _selects(monitor["selector"]["matchLabels"], archiver_service)
    browser_service = one(docs, "Service", "arch-archiver-browser")["metadata"]["labels"]
    assert not _selects(monitor["selector"]["matchLabels"], browser_service)
    browser_monitor = one(docs, "ServiceMonitor", "arch-archiver-browser")["spec"]
    assert [e["port"] for e in browser_monitor["endpoints"]] == ["http-browser"]
    assert _selects(browser_monitor["selector"]["matchLabels"], browser_service)
    assert not _selects(browser_monitor["selector"]["matchLabels"], archiver_service)


def test_the_browser_needs_a_store(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match=r"browser\.enabled needs config\.store"):
        chart.render(_with_browser(MINIMAL), name="arch")


def test_by_default_the_browser_holds_no_credential_of_the_archiver(chart: helm.Chart) -> None:
    """Defaults + browser + Ingress, with an archiver that has a write role (IRSA) and static write
    keys in its extraEnv: the exposed browser runs as a service account of its own without that
    role, and its pod carries none of the archiver's env vars, Secrets or volumes of credentials."""
    write_role = {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/archiver-write"}
    write_keys = [
        {"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "archiver-rw", "key": "id"}}},
        {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "archiver-rw", "key": "secret"}}},
        {"name": "AWS_REGION", "value": "eu-west-1"},
    ]
    values = _with_browser(
        {**WITH_STORE, "apiToken": TOKEN, "extraEnv": write_keys, "serviceAccount": {"annotations": write_role}},
        ingress=_ingress(),
    )
    docs = render(chart, values)
    archiver_pod = one(docs, "StatefulSet")["spec"]["template"]["spec"]
    (archiver,) = archiver_pod["containers"]
    pod = _browser_pod(docs)["spec"]
    browser = _browser(docs)
    # Its own service account, without the archiver's role.
    assert archiver_pod["serviceAccountName"] == "arch-archiver"
    assert pod["serviceAccountName"] == "arch-archiver-browser"
    account = one(docs, "ServiceAccount", "arch-archiver-browser")
    assert "annotations" not in account["metadata"] and account["automountServiceAccountToken"] is False
    assert pod["automountServiceAccountToken"] is False
    # No archiver env var: only the config file's path is shared (the same file, read-only).
    shared = {e["name"] for e in archiver["env"]} & {e["name"] for e in browser["env"]}
    assert shared == {"ARCHIVER_CONFIG"}
    assert browser["env"] == [{"name": "ARCHIVER_CONFIG", "value": CONFIG_FILE}]
    assert "envFrom" not in browser
    # No credential of any kind: no AWS key, no Secret but its own web config, no token.
    text = json.dumps(_browser_pod(docs))
    for secret in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "archiver-rw", "arch-archiver-token", TOKEN):
        assert secret not in text, secret
    assert not [v for v in pod["volumes"] if "secret" in v or "projected" in v]
    assert {m["name"] for m in browser["volumeMounts"]} == {"config", "tmp"}
    assert one(docs, "Ingress")["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"] == (
        "arch-archiver-browser"
    )
    validate_manifests(docs)


def test_a_browser_without_an_account_of_its_own_never_falls_back_to_the_archivers(chart: helm.Chart) -> None:
    """create: false without a name is the namespace's default account; the archiver's account only
    when named, and even then without the archiver's extraEnv."""
    values = _with_browser(
        {**WITH_STORE, "extraEnv": [{"name": "AWS_ACCESS_KEY_ID", "value": "write-key"}]},
        serviceAccount={"create": False},
    )
    docs = render(chart, values)
    assert _browser_pod(docs)["spec"]["serviceAccountName"] == "default"
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"] == ["arch-archiver"]
    named = render(chart, _with_browser(values, serviceAccount={"create": False, "name": "arch-archiver"}))
    assert _browser_pod(named)["spec"]["serviceAccountName"] == "arch-archiver"
    assert "write-key" not in json.dumps(_browser_pod(named))


def test_the_browser_mounts_only_the_archivers_volumes_its_web_config_reads(chart: helm.Chart) -> None:
    """Of the archiver's extraVolumes (its TLS certificate, a Secret of static write keys, a CA
    bundle), the browser gets only the certificate its inherited webConfig names; its own
    browser.extraVolumes/extraVolumeMounts come after. With a web config of its own that reads no
    file, it gets none of the archiver's."""
    volumes = [
        {"name": "tls", "secret": {"secretName": "archiver-tls"}},
        {"name": "aws", "secret": {"secretName": "archiver-rw-keys"}},
        {"name": "ca", "configMap": {"name": "archiver-ca"}},
    ]
    mounts = [
        {"name": "tls", "mountPath": "/etc/archiver/tls/", "readOnly": True},
        {"name": "aws", "mountPath": "/var/run/aws"},
        {"name": "ca", "mountPath": "/etc/ssl/archiver-ca.pem", "subPath": "ca.pem"},
    ]
    tls = {"tls_server_config": {"cert_file": "/etc/archiver/tls/tls.crt", "key_file": "/etc/archiver/tls/tls.key"}}
    own_ca = {"name": "store-ca", "configMap": {"name": "store-ca"}}
    own_mount = {"name": "store-ca", "mountPath": "/etc/ssl/store"}
    values = _with_browser(
        {**WITH_STORE, "extraVolumes": volumes, "extraVolumeMounts": mounts, "webConfig": tls},
        ingress=_ingress(),
        extraVolumes=[own_ca],
        extraVolumeMounts=[own_mount],
    )
    docs = render(chart, values)
    pod = _browser_pod(docs)["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["config", "web-config", "tmp", "tls", "store-ca"]
    assert [m["name"] for m in _browser(docs)["volumeMounts"]] == ["config", "web-config", "tmp", "tls", "store-ca"]
    assert {"name": "tls", "secret": {"secretName": "archiver-tls"}} in pod["volumes"]
    assert own_mount in _browser(docs)["volumeMounts"]
    assert "archiver-rw-keys" not in json.dumps(pod) and "/var/run/aws" not in json.dumps(pod)
    # The archiver keeps all of its own.
    archiver_pod = one(docs, "StatefulSet")["spec"]["template"]["spec"]
    assert {"tls", "aws", "ca"} <= {v["name"] for v in archiver_pod["volumes"]}
    validate_manifests(docs)

    # A CA file the web config names may be a single file mounted with subPath.
    client_ca = {"tls_server_config": {**tls["tls_server_config"], "client_ca_file": "/etc/ssl/archiver-ca.pem"}}
    with_ca = render(chart, {**values, "webConfig": client_ca})
    assert [v["name"] for v in _browser_pod(with_ca)["spec"]["volumes"]][3:] == ["tls", "ca", "store-ca"]

    # A web config of its own (basic auth, no file): nothing of the archiver's.
    own_web = render(chart, _with_browser(values, webConfig={"basic_auth_users": BCRYPT_USERS}))
    assert [v["name"] for v in _browser_pod(own_web)["spec"]["volumes"]] == ["config", "web-config", "tmp"]
    assert "archiver-tls" not in json.dumps(_browser_pod(own_web))


def test_read_only_s3_keys_are_the_browsers_only_keys(chart: helm.Chart) -> None:
    """A Secret of read-only keys: the browser takes its keys from it, never from the archiver's
    extraEnv; its own extraEnv still applies."""
    archiver_keys = [{"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "rw", "key": "id"}}}]
    values = _with_browser(
        {**WITH_STORE, "extraEnv": archiver_keys},
        s3Credentials={"existingSecret": "archive-ro", "accessKeyIdKey": "id", "secretAccessKeyKey": "secret"},
        extraEnv=[{"name": "AWS_REGION", "value": "eu-west-1"}],
    )
    env = _browser(render(chart, values))["env"]
    assert env == [
        {"name": "ARCHIVER_CONFIG", "value": CONFIG_FILE},
        {"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "archive-ro", "key": "id"}}},
        {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "archive-ro", "key": "secret"}}},
        {"name": "AWS_REGION", "value": "eu-west-1"},
    ]


def test_a_service_account_of_its_own_carries_a_read_only_role(chart: helm.Chart) -> None:
    role = {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/evidence-read-only"}
    values = _with_browser(
        {**WITH_STORE, "extraEnv": [{"name": "AWS_ACCESS_KEY_ID", "value": "write-key"}]},
        serviceAccount={"create": True, "annotations": role},
    )
    docs = render(chart, values)
    account = one(docs, "ServiceAccount", "arch-archiver-browser")
    assert account["metadata"]["annotations"] == role and account["automountServiceAccountToken"] is False
    assert _browser_pod(docs)["spec"]["serviceAccountName"] == "arch-archiver-browser"
    assert "write-key" not in json.dumps(_browser(docs))
    existing = render(chart, _with_browser(WITH_STORE, serviceAccount={"name": "evidence-reader"}))
    assert _browser_pod(existing)["spec"]["serviceAccountName"] == "evidence-reader"
    assert not [d for d in existing if d["kind"] == "ServiceAccount" and "browser" in d["metadata"]["name"]]


def test_a_web_config_of_its_own_guards_the_browser(chart: helm.Chart) -> None:
    """browser.webConfig (basic auth for support staff) goes into a Secret of its own; the probes turn
    to TCP, which kubelet can pass without a password."""
    values = _with_browser(
        {**WITH_STORE, "webConfig": {"tls_server_config": {}}}, webConfig={"basic_auth_users": BCRYPT_USERS}
    )
    docs = render(chart, values)
    volumes = {v["name"]: v for v in _browser_pod(docs)["spec"]["volumes"]}
    assert volumes["web-config"]["secret"]["secretName"] == "arch-archiver-browser-web-config"
    assert (
        one(docs, "Secret", "arch-archiver-browser-web-config")["metadata"]["labels"]["app.kubernetes.io/component"]
        == "browser"
    )
    browser = _browser(docs)
    assert _flag(browser["args"], "--web.config.file") == WEB_CONFIG_FILE
    assert browser["livenessProbe"]["tcpSocket"] == {"port": "http-browser"}
    assert "httpGet" not in browser["readinessProbe"]
    no_web = _browser(render(chart, _with_browser(WITH_STORE)))
    assert "--web.config.file" not in no_web["args"]
    assert "web-config" not in {m["name"] for m in no_web["volumeMounts"]}


# (ingress settings, browser.externalUrl, the browser's URL)
URL_CASES: list[tuple[dict[str, Any] | None, str, str]] = [
    (None, "", "http://arch-archiver-browser.observability.svc:9878"),
    (None, "https://evidence.example.com/cases/", "https://evidence.example.com/cases"),
    (_ingress(), "", "http://evidence.example.com"),
    (
        _ingress(path="/archive", tls=[{"secretName": "t", "hosts": ["evidence.example.com"]}]),
        "",
        "https://evidence.example.com/archive",
    ),
    (_ingress(tls=[{"secretName": "t", "hosts": ["other.example.com"]}]), "", "http://evidence.example.com"),
    (_ingress(hosts=["a.example.com", "b.example.com"], tls=[{"secretName": "wildcard"}]), "", "https://a.example.com"),
    # TLS terminated in front of the Ingress (a cloud load balancer): scheme and host from the value.
    (_ingress(path="/archive"), "https://evidence.studio.example/archive", "https://evidence.studio.example/archive"),
]


@pytest.mark.parametrize(("ingress", "external_url", "url"), URL_CASES)
def test_the_browser_url_is_computed_once_and_used_everywhere(
    chart: helm.Chart, ingress: dict[str, Any] | None, external_url: str, url: str
) -> None:
    """Ingress (first host, path, https when a tls entry covers the host), else browser.externalUrl,
    else the in-cluster Service URL: the browser's --web.external-url, its probes' route prefix and
    both dashboards' browser_url are that one URL."""
    browser: dict[str, Any] = {"externalUrl": external_url}
    if ingress is not None:
        browser["ingress"] = ingress
    docs = render(chart, _with_browser({**WITH_STORE, "dashboards": {"enabled": True}}, **browser))
    container = _browser(docs)
    assert _flag(container["args"], "--web.external-url") == url
    prefix = "/" + url.split("/", 3)[3] if url.count("/") > 2 else ""
    assert container["readinessProbe"]["httpGet"]["path"] == f"{prefix}/healthz"
    assert _browser_urls(docs) == dict.fromkeys(DASHBOARD_SOURCES, url)


def test_the_dashboards_link_session_ids_to_the_ingress_url(chart: helm.Chart) -> None:
    """The ci values' Ingress (oauth2-proxy, TLS, /archive prefix): every session-id data link of both
    dashboards resolves, as Grafana substitutes ${browser_url:raw}, to that Ingress URL; nothing else
    in the dashboards changes."""
    docs = render(chart, {**WITH_STORE, "browser": BROWSER_INGRESS, "dashboards": {"enabled": True}})
    ingress = one(docs, "Ingress")
    rule = ingress["spec"]["rules"][0]
    tls_hosts = {h for entry in ingress["spec"]["tls"] for h in entry["hosts"]}
    scheme = "https" if rule["host"] in tls_hosts else "http"
    ingress_url = f"{scheme}://{rule['host']}{rule['http']['paths'][0]['path']}"
    assert ingress_url == "https://evidence.example.com/archive"
    maps = {
        next(iter(cm["data"])): json.loads(next(iter(cm["data"].values())))
        for cm in docs
        if cm["kind"] == "ConfigMap" and "grafana_dashboard" in cm["metadata"]["labels"]
    }
    assert maps.keys() == DASHBOARD_SOURCES.keys()
    for name, board in maps.items():
        (variable,) = [v for v in board["templating"]["list"] if v["name"] == "browser_url"]
        links = [
            link["url"]
            .replace("${browser_url:raw}", variable["query"])
            .replace("${__value.raw:percentencode}", "eu%2Fm-1")
            for link in _data_links(board)
        ]
        assert links and all(link == f"{ingress_url}/sessions/eu%2Fm-1" for link in links), (name, links)
        source = json.loads(DASHBOARD_SOURCES[name])
        for board_variable in (variable, *[v for v in source["templating"]["list"] if v["name"] == "browser_url"]):
            board_variable.update(query=None, current=None, options=None)
        assert board == source, name


def _data_links(board: dict[str, Any]) -> list[dict[str, Any]]:
    panels = [p for top in board["panels"] for p in (top, *top.get("panels", []))]
    return [
        link
        for panel in panels
        for override in panel.get("fieldConfig", {}).get("overrides", [])
        for prop in override["properties"]
        if prop["id"] == "links"
        for link in prop["value"]
    ]


def test_dashboards_keep_their_default_without_a_browser_url(chart: helm.Chart) -> None:
    """Without the browser and without browser.externalUrl the dashboards ship as they are; with only
    browser.externalUrl (a browser run elsewhere) they link there."""
    plain = render(chart, {**MINIMAL, "dashboards": {"enabled": True}})
    bodies = {
        next(iter(cm["data"])): next(iter(cm["data"].values()))
        for cm in plain
        if "grafana_dashboard" in cm["metadata"]["labels"]
    }
    # Byte for byte, but for the final newline YAML's `|-` block drops.
    assert bodies == {name: text.rstrip("\n") for name, text in DASHBOARD_SOURCES.items()}
    elsewhere = render(
        chart, {**MINIMAL, "dashboards": {"enabled": True}, "browser": {"externalUrl": "https://ev.example.com/"}}
    )
    assert _browser_urls(elsewhere) == dict.fromkeys(DASHBOARD_SOURCES, "https://ev.example.com")
    assert not [d for d in elsewhere if d["kind"] == "Deployment"]


def test_the_ingress_routes_every_host_to_the_browser_service(chart: helm.Chart) -> None:
    docs = render(chart, {**WITH_STORE, "browser": BROWSER_INGRESS})
    ingress = one(docs, "Ingress")
    assert ingress["apiVersion"] == "networking.k8s.io/v1"
    assert ingress["metadata"]["annotations"] == BROWSER_INGRESS["ingress"]["annotations"]
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == BROWSER_INGRESS["ingress"]["tls"]
    backend = {"service": {"name": "arch-archiver-browser", "port": {"name": "http-browser"}}}
    assert ingress["spec"]["rules"] == [
        {"host": host, "http": {"paths": [{"path": "/archive", "pathType": "Prefix", "backend": backend}]}}
        for host in BROWSER_INGRESS["ingress"]["hosts"]
    ]
    assert one(docs, "Service", "arch-archiver-browser")["spec"]["ports"][0]["name"] == "http-browser"
    validate_manifests(docs)
    assert not [
        d
        for d in render(chart, {**WITH_STORE, "browser": {**BROWSER_INGRESS, "enabled": False}})
        if d["kind"] == "Ingress"
    ]


# Browser settings whose Ingress would publish the evidence to anyone.
UNAUTHENTICATED: dict[str, dict[str, Any]] = {
    "no-annotations": {"ingress": _ingress(annotations={})},
    "signin-without-auth-url": {
        "ingress": _ingress(annotations={"nginx.ingress.kubernetes.io/auth-signin": "https://x"})
    },
    "basic-auth-without-secret": {"ingress": _ingress(annotations={"nginx.ingress.kubernetes.io/auth-type": "basic"})},
    "alb-auth-none": {"ingress": _ingress(annotations={"alb.ingress.kubernetes.io/auth-type": "none"})},
    "tls-only-web-config": {"ingress": _ingress(annotations={}), "webConfig": {"tls_server_config": {}}},
}
# Browser settings the chart sees authentication in (or that say it happens elsewhere).
AUTHENTICATED: dict[str, dict[str, Any]] = {
    "oauth2-proxy": {"ingress": _ingress()},
    "browser-basic-auth": {"ingress": _ingress(annotations={}), "webConfig": {"basic_auth_users": BCRYPT_USERS}},
    "nginx-basic-auth": {
        "ingress": _ingress(
            annotations={
                "nginx.ingress.kubernetes.io/auth-type": "basic",
                "nginx.ingress.kubernetes.io/auth-secret": "htpasswd",
            }
        )
    },
    "alb-oidc": {"ingress": _ingress(annotations={"alb.ingress.kubernetes.io/auth-type": "oidc"})},
    "explicitly-allowed": {"ingress": _ingress(annotations={}, allowUnauthenticated=True)},
}


@pytest.mark.parametrize("browser", UNAUTHENTICATED.values(), ids=UNAUTHENTICATED.keys())
def test_an_ingress_without_authentication_is_refused(chart: helm.Chart, browser: dict[str, Any]) -> None:
    """Evidence is sensitive: one line names the ways out, and nothing renders."""
    with pytest.raises(helm.HelmRenderError, match="without authentication") as caught:
        chart.render(_with_browser(WITH_STORE, **browser), name="arch")
    message = str(caught.value).strip()
    assert "\n" not in message
    assert "basic_auth_users" in message and "auth-url" in message and "allowUnauthenticated" in message


@pytest.mark.parametrize("browser", AUTHENTICATED.values(), ids=AUTHENTICATED.keys())
def test_an_authenticated_ingress_renders(chart: helm.Chart, browser: dict[str, Any]) -> None:
    assert one(render(chart, _with_browser(WITH_STORE, **browser)), "Ingress")


@pytest.mark.parametrize(
    ("browser", "message"),
    [
        ({"ingress": _ingress(hosts=[])}, r"browser\.ingress\.hosts: give at least one host"),
        ({"ingress": _ingress(hosts=["*.example.com"])}, "cannot be a wildcard"),
        (
            {"ingress": _ingress(path="/archive"), "externalUrl": "https://ev.example.com/other"},
            "must be the Ingress path",
        ),
    ],
    ids=["no-host", "wildcard-first", "prefix-mismatch"],
)
def test_an_ingress_without_a_usable_url_is_refused(chart: helm.Chart, browser: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        chart.render(_with_browser(WITH_STORE, **browser), name="arch")


def test_network_policy_opens_the_browser_port_to_its_own_peers(chart: helm.Chart) -> None:
    """The browser's pods get a policy of their own: the browser port from browser.ingressFrom, and the
    archiver's egress rules (the same store); the archiver's policy opens the metrics port only."""
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}}}]
    egress = [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 443, "protocol": "TCP"}]}]
    values = _with_browser({**WITH_STORE, "networkPolicy": {"enabled": True, "egress": egress}}, ingressFrom=peers)
    docs = render(chart, values)
    browser_policy = one(docs, "NetworkPolicy", "arch-archiver-browser")["spec"]
    assert browser_policy["ingress"] == [{"ports": [{"port": "http-browser", "protocol": "TCP"}], "from": peers}]
    assert browser_policy["egress"][:-1] == egress and browser_policy["policyTypes"] == ["Ingress", "Egress"]
    (archiver_rule,) = one(docs, "NetworkPolicy", "arch-archiver")["spec"]["ingress"]
    assert archiver_rule["ports"] == [{"port": "http-metrics", "protocol": "TCP"}]
    validate_manifests(docs)


def test_the_browsers_metrics_are_scraped_by_a_service_monitor_of_its_own(chart: helm.Chart, tmp_path: Path) -> None:
    """With the ServiceMonitor and the browser on: a second ServiceMonitor selects the browser's
    Service only (its own job, apart from the archiver's the rules select), on its port, at
    ``{prefix}/metrics``, the path the browser started with these arguments really serves."""
    monitor = {"enabled": True, "additionalLabels": {"release": "kube-prometheus-stack"}, "interval": "1m"}
    values = _with_browser({**WITH_STORE, "serviceMonitor": monitor}, ingress=_ingress(path="/archive"))
    docs = render(chart, values)
    archiver_monitor = one(docs, "ServiceMonitor", "arch-archiver")["spec"]
    browser_monitor = one(docs, "ServiceMonitor", "arch-archiver-browser")
    assert browser_monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    spec = browser_monitor["spec"]
    selector = spec["selector"]["matchLabels"]
    browser_service = one(docs, "Service", "arch-archiver-browser")
    assert _selects(selector, browser_service["metadata"]["labels"])
    assert not _selects(selector, one(docs, "Service", "arch-archiver")["metadata"]["labels"])
    assert not _selects(archiver_monitor["selector"]["matchLabels"], browser_service["metadata"]["labels"])
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] in {port["name"] for port in browser_service["spec"]["ports"]}
    assert (endpoint["path"], endpoint["scheme"], endpoint["interval"]) == ("/archive/metrics", "http", "1m")
    # The browser started with the Deployment's arguments serves its process metrics at that path.
    args = _browser(docs)["args"]
    app = BrowseApp(open_store(tmp_path.as_uri()), mount=mount(_flag(args, "--web.external-url")))
    response = app.handle(endpoint["path"], {})
    assert response.status == 200 and b"process_cpu_seconds_total" in b"".join(response.body)
    validate_manifests(docs)

    # Optional: off with serviceMonitor.browser.enabled, and never without the browser.
    off = render(chart, {**values, "serviceMonitor": {**monitor, "browser": {"enabled": False}}})
    assert [d["metadata"]["name"] for d in off if d["kind"] == "ServiceMonitor"] == ["arch-archiver"]
    alone = render(chart, {**WITH_STORE, "serviceMonitor": monitor})
    assert [d["metadata"]["name"] for d in alone if d["kind"] == "ServiceMonitor"] == ["arch-archiver"]


def test_the_browsers_scrape_follows_its_own_web_config_and_network_policy(chart: helm.Chart) -> None:
    """HTTPS and basic auth from serviceMonitor.browser.* for a browser with a web config of its own;
    Prometheus' peers (networkPolicy.ingressFrom) may reach the browser port beside browser.ingressFrom."""
    auth = {"username": {"name": "scrape", "key": "user"}, "password": {"name": "scrape", "key": "password"}}
    prometheus = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    ingress = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}}}]
    values = _with_browser(
        {
            **WITH_STORE,
            "serviceMonitor": {
                "enabled": True,
                "tlsConfig": {"insecureSkipVerify": True},
                "browser": {"basicAuth": auth},
            },
            "networkPolicy": {"enabled": True, "ingressFrom": prometheus},
        },
        webConfig={"tls_server_config": {}, "basic_auth_users": BCRYPT_USERS},
        ingressFrom=ingress,
    )
    docs = render(chart, values)
    (endpoint,) = one(docs, "ServiceMonitor", "arch-archiver-browser")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["basicAuth"] == auth
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}  # the archiver's, none of its own given
    (archiver_endpoint,) = one(docs, "ServiceMonitor", "arch-archiver")["spec"]["endpoints"]
    assert archiver_endpoint["scheme"] == "http" and "basicAuth" not in archiver_endpoint
    port = [{"port": "http-browser", "protocol": "TCP"}]
    assert one(docs, "NetworkPolicy", "arch-archiver-browser")["spec"]["ingress"] == [
        {"ports": port, "from": ingress},
        {"ports": port, "from": prometheus},
    ]
    validate_manifests(docs)
    # Not scraped: the browser port stays closed to Prometheus.
    unscraped = render(chart, {**values, "serviceMonitor": {"enabled": True, "browser": {"enabled": False}}})
    assert one(unscraped, "NetworkPolicy", "arch-archiver-browser")["spec"]["ingress"] == [
        {"ports": port, "from": ingress}
    ]


def test_a_misspelt_browser_key_is_refused(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmError, match="additional properties 'enabeld' not allowed"):
        render(chart, {**MINIMAL, "browser": {"enabeld": True}})
    with pytest.raises(helm.HelmError, match="additional properties 'allowUnauthenticatd' not allowed"):
        render(chart, {**MINIMAL, "browser": {"ingress": {"allowUnauthenticatd": True}}})


def test_notes_show_the_browser_url(chart: helm.Chart, tmp_path: Path) -> None:
    notes = chart.render({**WITH_STORE, "browser": BROWSER_INGRESS}, name="arch", namespace="observability")
    text = next(body for path, body in notes.items() if path.endswith("NOTES.txt"))
    assert "https://evidence.example.com/archive/sessions" in text
    assert "exec arch-archiver-0 -- archiver check" in text
    assert "NOTE: the browser runs as" not in text  # its role is annotated


def test_notes_say_when_the_browser_has_no_credential_to_read_with(chart: helm.Chart) -> None:
    """Least privilege by default leaves a browser of an S3 store with no credential at all until it
    is given a read-only one: the notes say so, and stop once it has a role, keys or env of its own."""

    def notes(**browser: Any) -> str:
        rendered = chart.render(_with_browser(WITH_STORE, **browser), name="arch", namespace="observability")
        return next(body for path, body in rendered.items() if path.endswith("NOTES.txt"))

    assert "NOTE: the browser runs as ServiceAccount arch-archiver-browser" in notes()
    role = {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/evidence-read-only"}
    assert "NOTE: the browser" not in notes(serviceAccount={"create": True, "annotations": role})
    assert "NOTE: the browser" not in notes(s3Credentials={"existingSecret": "archive-ro"})
    assert "NOTE: the browser" not in notes(serviceAccount={"create": False, "name": "evidence-reader"})
