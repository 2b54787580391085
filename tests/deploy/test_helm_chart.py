"""The Helm chart helm/archiver renders, lints and validates, and wires config, token and extras right.

Rendering and linting use helm-python-sdk (Helm's Go SDK through ctypes, no helm binary);
every rendered core manifest is validated with kubernetes-validate against the Kubernetes
OpenAPI schemas it ships (every minor version from the chart's kubeVersion floor through 1.33, and
the newest), in strict mode (unknown fields are errors), and the prometheus-operator objects
against structural CRD schemas in tests/data/crds. values.schema.json refuses unknown keys. The
CI values files (ci/*-values.yaml: defaults, every feature, the browser behind an Ingress, a
sharded fleet) and the chart as an umbrella chart's dependency all render valid manifests.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from archiver.fake import FakeService
from tests.fixtures_fake import TEST_TOKEN
from tests.support import (
    ALL_FEATURES,
    BROWSER_INGRESS,
    CHART,
    CI_VALUES,
    CRD_SCHEMAS,
    K8S_VERSIONS,
    MINIMAL,
    SELECTOR,
    Doc,
    chart_values,
    free_port,
    one,
    render,
    validate_manifests,
)
from tests.support import CHART_TOKEN as TOKEN

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "grafana"
TOKEN_FILE = "/etc/archiver/secret/api-token"


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def container(docs: list[Doc]) -> Doc:
    containers = one(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    found: Doc = containers[0]
    return found


def rendered_toml(docs: list[Doc]) -> dict[str, Any]:
    return tomllib.loads(one(docs, "ConfigMap", "arch-archiver")["data"]["config.toml"])


def without_nulls(value: Any) -> Any:
    """What TOML can carry: a null in values means "drop this key"."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    return value


def test_default_values_refuse_to_render_without_api_url_and_token(chart: helm.Chart) -> None:
    """The two settings without a default fail the render with a message naming them."""
    with pytest.raises(helm.HelmRenderError, match=r"config\.api_url is required"):
        chart.render({}, name="arch")
    with pytest.raises(helm.HelmRenderError, match="existingSecret"):
        chart.render({"config": {"api_url": "https://api.example.com"}}, name="arch")


@pytest.mark.parametrize("values_file", CI_VALUES)
def test_chart_lints_clean(values_file: str) -> None:
    """helm lint --strict finds no warning or error with the CI values files."""
    report = helm.lint(CHART, chart_values(values_file), strict=True)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


@pytest.mark.parametrize("values_file", CI_VALUES)
def test_rendered_manifests_validate_against_kubernetes_schemas(chart: helm.Chart, values_file: str) -> None:
    """Every core manifest of every CI values file (defaults, every feature, the browser behind an
    Ingress, 3 shards x 2 replicas) passes strict schema validation in Kubernetes 1.25-1.33 and the
    newest; the operator objects pass their CRD schemas."""
    validate_manifests(render(chart, chart_values(values_file)))


def test_ci_values_files_cover_the_release_scenarios(chart: helm.Chart) -> None:
    """The values files validated above include the browser with an Ingress and a 3 x 2 fleet."""
    kinds = {name: {d["kind"] for d in render(chart, chart_values(name))} for name in CI_VALUES}
    assert any({"Deployment", "Ingress"} <= found for found in kinds.values()), kinds
    sharded = [
        n for n in CI_VALUES if (chart_values(n).get("shards"), chart_values(n).get("replicasPerShard")) == (3, 2)
    ]
    assert sharded and one(render(chart, chart_values(sharded[0])), "StatefulSet")["spec"]["replicas"] == 6


def _umbrella_chart(tmp_path: Path) -> Path:
    """A parent chart with this chart as a dependency, switched by `condition: archiver.enabled`."""
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    parent = tmp_path / "studio"
    (parent / "charts").mkdir(parents=True)
    shutil.copytree(CHART, parent / "charts" / "archiver")
    (parent / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "studio",
                "version": "1.0.0",
                "dependencies": [{"name": "archiver", "version": version, "condition": "archiver.enabled"}],
            }
        )
    )
    return parent


def test_chart_renders_as_a_subchart_switched_by_enabled(tmp_path: Path) -> None:
    """An umbrella chart sets `archiver.enabled` (its dependency condition): the strict schema accepts
    the key, every manifest validates, and `enabled: false` leaves the archiver out."""
    with helm.Chart.load(_umbrella_chart(tmp_path)) as parent:
        values = {"archiver": {**ALL_FEATURES, "enabled": True, "browser": BROWSER_INGRESS}}
        docs = render(parent, values)
        validate_manifests(docs)
        assert {"StatefulSet", "Deployment", "Ingress", "ServiceMonitor", "PrometheusRule"} <= {d["kind"] for d in docs}
        assert one(docs, "StatefulSet")["metadata"]["name"] == "arch-archiver"
        assert render(parent, {"archiver": {**ALL_FEATURES, "enabled": False}}) == []


def test_enabled_is_a_boolean(chart: helm.Chart) -> None:
    assert render(chart, {**MINIMAL, "enabled": True})
    with pytest.raises(helm.HelmError, match="enabled"):
        chart.render({**MINIMAL, "enabled": "yes"}, name="arch")


@pytest.mark.parametrize(
    ("kind", "path", "bad"),
    [
        ("ServiceMonitor", ["spec", "endpoints", 0, "intervall"], "30s"),
        ("ServiceMonitor", ["spec", "endpoints", 0, "interval"], "30 seconds"),
        ("PrometheusRule", ["spec", "groups", 0, "rules", 0, "annotation"], {}),
        ("PrometheusRule", ["spec", "groups", 0, "rules", 0, "for"], "5 minutes"),
    ],
)
def test_crd_schema_validation_catches_a_malformed_object(
    chart: helm.Chart, kind: str, path: list[Any], bad: Any
) -> None:
    """The CRD schemas above are live: a misspelt field or a malformed duration fails them."""
    doc = one(render(chart, ALL_FEATURES), kind)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = bad
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, CRD_SCHEMAS[("monitoring.coreos.com/v1", kind)])


def test_schema_validation_catches_a_malformed_manifest(chart: helm.Chart) -> None:
    """The validation above is live: a bad extra volume renders (the values schema leaves volume
    sources to Kubernetes) but fails the Pod schema."""
    values = {**MINIMAL, "extraVolumes": [{"name": "ca", "bogus": {"path": "/x"}}]}
    sts = one(render(chart, values), "StatefulSet")
    with pytest.raises(kubernetes_validate.ValidationError, match="bogus"):
        kubernetes_validate.validate(sts, K8S_VERSIONS[0], strict=True)


def test_defaults_create_only_the_core_objects(chart: helm.Chart) -> None:
    """ServiceMonitor, PrometheusRule, dashboards and NetworkPolicy are off by default; existingSecret
    makes no Secret; the helm test Pod is on."""
    kinds = sorted(d["kind"] for d in render(chart, MINIMAL))
    assert kinds == ["ConfigMap", "Pod", "Service", "ServiceAccount", "StatefulSet"]


def test_statefulset_runs_one_archiver_with_a_persistent_state_dir(chart: helm.Chart) -> None:
    docs = render(chart, MINIMAL)
    sts = one(docs, "StatefulSet")
    assert sts["spec"]["replicas"] == 1
    assert sts["spec"]["serviceName"] == one(docs, "Service")["metadata"]["name"]
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "state"
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert "storageClassName" not in claim["spec"]
    c = container(docs)
    assert c["image"] == "ghcr.io/session-archiver/archiver:1.0.0"  # appVersion
    assert c["args"][:5] == ["run", "--config", "/etc/archiver/config.toml", "--api-token-file", TOKEN_FILE]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["state"] == "/var/lib/archiver" == rendered_toml(docs)["state_dir"]
    assert mounts["config"] == "/etc/archiver/config.toml"
    assert c["ports"] == [{"name": "http-metrics", "containerPort": 9877, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http-metrics", "scheme": "HTTP"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http-metrics", "scheme": "HTTP"}
    assert c["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "640Mi"}}
    service = one(docs, "Service")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"][0]["name"] == "http-metrics"
    assert service["spec"]["ports"][0]["port"] == 9877


def test_pod_is_locked_down(chart: helm.Chart) -> None:
    """Non-root, read-only root filesystem, no capabilities, RuntimeDefault seccomp, no API token."""
    docs = render(chart, MINIMAL)
    pod = one(docs, "StatefulSet")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    sc = container(docs)["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # A read-only root needs a writable /tmp.
    assert {"name": "tmp", "mountPath": "/tmp"} in container(docs)["volumeMounts"]


def test_api_token_reaches_only_the_secret_and_is_passed_as_a_file(chart: helm.Chart) -> None:
    """apiToken becomes a chart Secret mounted as a file; no other manifest carries it."""
    values = {**MINIMAL, "existingSecret": "", "apiToken": TOKEN}
    docs = render(chart, values)
    secret = one(docs, "Secret", "arch-archiver-token")
    assert base64.b64decode(secret["data"]["api-token"]).decode() == TOKEN
    encoded = base64.b64encode(TOKEN.encode()).decode()
    for doc in docs:
        if doc is secret:
            continue
        text = json.dumps(doc)
        assert TOKEN not in text and encoded not in text, f"token leaked into {doc['kind']}"
    c = container(docs)
    args = c["args"]
    assert args[args.index("--api-token-file") + 1] == TOKEN_FILE
    # Never an environment variable: the env carries the token file's path only.
    assert {e["name"]: e.get("value") for e in c["env"]}["ARCHIVER_API_TOKEN_FILE"] == TOKEN_FILE
    assert "ARCHIVER_API_TOKEN" not in {e["name"] for e in c["env"]}
    assert {"name": "api-token", "mountPath": "/etc/archiver/secret", "readOnly": True} in c["volumeMounts"]
    volumes = one(docs, "StatefulSet")["spec"]["template"]["spec"]["volumes"]
    token_volume = next(v for v in volumes if v["name"] == "api-token")
    assert token_volume["secret"]["secretName"] == "arch-archiver-token"
    assert token_volume["secret"]["items"] == [{"key": "api-token", "path": "api-token"}]


def test_existing_secret_is_mounted_and_no_secret_is_created(chart: helm.Chart) -> None:
    docs = render(chart, {**MINIMAL, "existingSecret": "team-archiver-token", "apiToken": TOKEN})
    assert [d for d in docs if d["kind"] == "Secret"] == []
    assert TOKEN not in json.dumps(docs)
    volumes = one(docs, "StatefulSet")["spec"]["template"]["spec"]["volumes"]
    token_volume = next(v for v in volumes if v["name"] == "api-token")
    assert token_volume["secret"]["secretName"] == "team-archiver-token"
    assert token_volume["secret"]["items"] == [{"key": "api-token", "path": "api-token"}]


def test_existing_secret_key_names_the_token_inside_the_secret(chart: helm.Chart) -> None:
    """An External Secrets / Sealed Secrets object may store the token under another key: the
    daemon and the helm test pod mount that key at the same path; a chart-made Secret ignores it."""
    docs = render(chart, {**MINIMAL, "existingSecret": "vault-synced", "existingSecretKey": "GAMEYE_TOKEN"})
    pods = [one(docs, "StatefulSet")["spec"]["template"]["spec"], one(docs, "Pod")["spec"]]
    for pod in pods:
        (token_volume,) = [v for v in pod["volumes"] if v["name"] == "api-token"]
        assert token_volume["secret"] == {
            "secretName": "vault-synced",
            "defaultMode": 0o440,
            "items": [{"key": "GAMEYE_TOKEN", "path": "api-token"}],
        }
    own = render(chart, {**MINIMAL, "existingSecret": "", "apiToken": TOKEN, "existingSecretKey": "GAMEYE_TOKEN"})
    assert list(one(own, "Secret")["data"]) == ["api-token"]
    volumes = one(own, "StatefulSet")["spec"]["template"]["spec"]["volumes"]
    assert next(v for v in volumes if v["name"] == "api-token")["secret"]["items"][0]["key"] == "api-token"


def test_the_transparency_log_key_comes_from_a_secret_as_a_file(chart: helm.Chart) -> None:
    assert "--tlog-key-file" not in container(render(chart, MINIMAL))["args"]
    docs = render(chart, {**MINIMAL, "transparencyLog": {"existingSecret": "archiver-log-key"}})
    validate_manifests(docs)
    args = container(docs)["args"]
    assert args[args.index("--tlog-key-file") + 1] == "/etc/archiver/tlog/log.key"
    spec = one(docs, "StatefulSet")["spec"]["template"]["spec"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "tlog-key"]
    assert volume["secret"] == {
        "secretName": "archiver-log-key",
        "defaultMode": 0o400,
        "items": [{"key": "log.key", "path": "log.key"}],
    }
    assert {"name": "tlog-key", "mountPath": "/etc/archiver/tlog", "readOnly": True} in container(docs)["volumeMounts"]


@pytest.mark.parametrize(
    "key", ["api_token", "api_token_file", "web_config_file", "shard", "total_shards", "tlog_key_file"]
)
def test_token_and_chart_managed_keys_are_refused_in_config(chart: helm.Chart, key: str) -> None:
    """The token never goes into the ConfigMap: the schema rejects such keys before rendering."""
    values = {**MINIMAL, "config": {**MINIMAL["config"], key: TOKEN}}
    with pytest.raises(helm.HelmError, match=key):
        chart.render(values, name="arch")


TOML_CASES: dict[str, dict[str, Any]] = {
    "minimal": {},
    "every-key": ALL_FEATURES["config"],
    "tricky-strings": {
        "store": "file:///srv/archive dir/ü",
        "artifact_path": ['/a "quoted"\\path', "/tab\there", "/<html>&amp;", "/new\nline", "/é€😀"],
        "session_label_allowlist": [],
        "poll_interval": 2.5,
        "retention": 14400,
        "max_sessions": 0,
        "log_format": "text",
        "images": {
            "registry.example.com/team/game:1.2": {"artifact_path": ["/srv/x"]},
            "demo-game": {"artifact_path": []},
            "empty": {},
        },
    },
    "null-drops-a-default": {"log_format": None, "images": {}},
}


@pytest.mark.parametrize("overrides", TOML_CASES.values(), ids=TOML_CASES.keys())
def test_config_toml_parses_back_to_the_config_values(chart: helm.Chart, overrides: dict[str, Any]) -> None:
    """tomllib reads back exactly the merged `config` values (strings, numbers, lists, tables)."""
    values = {**MINIMAL, "config": {**MINIMAL["config"], **overrides}}
    expected = without_nulls(chart.merge_values(values)["config"])
    assert rendered_toml(render(chart, values)) == expected


def test_chart_config_keys_are_the_daemon_options() -> None:
    """The schema allows exactly the TOML keys archiver.config.settings accepts, minus the flags the chart
    sets itself (--api-token-file, --web.config.file, --tlog-key-file from a Secret, and the shard
    options from `shards` and `replicasPerShard`: a shard count in the file that disagrees with the
    pod count would leave sessions without an owner)."""
    from archiver.config.options import OPTIONS

    schema = json.loads((CHART / "values.schema.json").read_text())
    chart_keys = set(schema["properties"]["config"]["properties"])
    chart_set = {"api_token_file", "web_config_file", "shard", "total_shards", "replicas_per_shard", "tlog_key_file"}
    # A deprecated name's key too (config.listen), for a release.
    aliases = {alias.key for opt in OPTIONS for alias in opt.aliases if alias.key}
    daemon_keys = ({opt.key for opt in OPTIONS} | aliases) - chart_set | {"images"}
    assert chart_keys == daemon_keys


def test_daemon_loads_the_rendered_config(chart: helm.Chart, tmp_path: Path) -> None:
    """The ConfigMap's config.toml, read by archiver.config.settings like `archiver run --config` does."""
    from archiver.config.settings import load_settings

    config_file = tmp_path / "config.toml"
    docs = render(chart, ALL_FEATURES)
    config_file.write_text(one(docs, "ConfigMap", "arch-archiver")["data"]["config.toml"])
    token_file = tmp_path / "api-token"
    token_file.write_text(TOKEN)
    settings = load_settings({"api_token_file": str(token_file)}, env={}, config_file=config_file)
    assert settings.api_url == "https://api.example.com"
    assert settings.store == "s3://archive-bucket/sessions/"
    assert settings.state_dir == Path("/var/lib/archiver")
    assert settings.poll_interval == 10.0 and settings.retention == 4 * 3600.0
    assert settings.deadline_margin == 600.0 and settings.max_artifact_size == 110_000_000
    assert settings.log_format == "json" and settings.s3_checksum == "when_required"
    assert settings.artifact_paths_for("demo-game") == (
        "/var/log/game/server.log",
        "/srv/replays/match.replay",
        "/srv/crash/core.txt",
    )


def test_config_change_rolls_the_pod(chart: helm.Chart) -> None:
    def checksum(values: dict[str, Any]) -> str:
        sts = one(render(chart, values), "StatefulSet")
        annotation: str = sts["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        return annotation

    same = checksum(MINIMAL)
    assert same == checksum(MINIMAL)
    changed = {**MINIMAL, "config": {**MINIMAL["config"], "poll_interval": "30s"}}
    assert checksum(changed) != same


def test_listen_port_drives_container_port(chart: helm.Chart) -> None:
    values = {**MINIMAL, "config": {**MINIMAL["config"], "web_listen_address": "[::]:9100"}}
    assert container(render(chart, values))["ports"][0]["containerPort"] == 9100


def test_the_deprecated_config_listen_still_sets_the_address_and_the_port(chart: helm.Chart) -> None:
    """A 0.x values file's config.listen wins over the new key's default, in the file and the port alike."""
    values = {**MINIMAL, "config": {**MINIMAL["config"], "listen": ":9200"}}
    docs = render(chart, values)
    assert container(docs)["ports"][0]["containerPort"] == 9200
    toml = rendered_toml(docs)
    assert toml["listen"] == ":9200" and "web_listen_address" not in toml


def test_more_than_one_replica_is_refused(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmError, match="replicaCount"):
        chart.render({**MINIMAL, "replicaCount": 2}, name="arch")
    paused = render(chart, {**MINIMAL, "replicaCount": 0})
    assert one(paused, "StatefulSet")["spec"]["replicas"] == 0


def test_shards_and_replicas_run_one_statefulset_with_a_pdb_and_spread_pods(chart: helm.Chart) -> None:
    """3 shards x 2 replicas: six pods told to take their shard from their ordinal, a PDB, a spread
    over nodes; every manifest validates. The default (1 x 1) has none of it."""
    sharded = {**MINIMAL, "shards": 3, "replicasPerShard": 2}
    report = helm.lint(CHART, sharded, strict=True)
    assert report["errors"] == [] and not [m for m in report["messages"] if m["severity"] >= 2], report
    docs = render(chart, sharded)
    sts = one(docs, "StatefulSet")
    assert sts["spec"]["replicas"] == 6
    args = container(docs)["args"]
    assert args[args.index("--shard") + 1] == "auto"
    assert args[args.index("--total-shards") + 1] == "3" and args[args.index("--replicas-per-shard") + 1] == "2"
    env = {e["name"]: e for e in container(docs)["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    (spread,) = sts["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    # The archiver pods only (not the browser's, which share the name and instance labels).
    archiver_pods = one(docs, "Service")["spec"]["selector"]
    assert archiver_pods["app.kubernetes.io/component"] == "archiver"
    assert archiver_pods.items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    assert spread["labelSelector"]["matchLabels"] == archiver_pods
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": archiver_pods}}
    validate_manifests(docs)
    single = render(chart, MINIMAL)
    assert not [d for d in single if d["kind"] == "PodDisruptionBudget"]
    assert "--shard" not in container(single)["args"]
    assert "topologySpreadConstraints" not in one(single, "StatefulSet")["spec"]["template"]["spec"]
    paused = render(chart, {**MINIMAL, "shards": 2, "replicaCount": 0})
    assert one(paused, "StatefulSet")["spec"]["replicas"] == 0


def test_sharded_pods_start_without_waiting_on_each_other(chart: helm.Chart) -> None:
    """3 shards: the StatefulSet creates every pod at once (Parallel), so a shard whose /readyz fails
    (upstream outage, bad token) keeps no other shard from starting; nothing else in the pod (an
    init container, a probe of another pod) waits on a sibling. OrderedReady stays selectable for a
    StatefulSet created before (the field is immutable), and anything else is refused."""
    docs = render(chart, {**MINIMAL, "shards": 3})
    sts = one(docs, "StatefulSet")
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    pod = sts["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    (archiver,) = pod["containers"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert archiver[probe]["httpGet"]["port"] == "http-metrics", probe  # its own port, no sibling's
    validate_manifests(docs)
    assert one(render(chart, MINIMAL), "StatefulSet")["spec"]["podManagementPolicy"] == "Parallel"
    ordered = render(chart, {**MINIMAL, "shards": 3, "podManagementPolicy": "OrderedReady"})
    assert one(ordered, "StatefulSet")["spec"]["podManagementPolicy"] == "OrderedReady"
    with pytest.raises(helm.HelmError, match="podManagementPolicy"):
        chart.render({**MINIMAL, "podManagementPolicy": "Ordered"}, name="arch")


def test_a_sharded_pod_name_gives_the_daemon_its_shard(chart: helm.Chart, tmp_path: Path) -> None:
    """The rendered config plus the chart's args and the pod name `arch-archiver-3`, read by
    archiver.config.settings as `archiver run` does: shard 1 of 2, replica 1."""
    from archiver.config.settings import load_settings
    from archiver.config.sharding import Shard

    docs = render(chart, {**MINIMAL, "shards": 2, "replicasPerShard": 2})
    config_file = tmp_path / "config.toml"
    config_file.write_text(one(docs, "ConfigMap", "arch-archiver")["data"]["config.toml"])
    args = container(docs)["args"]
    flags = {args[i][2:].replace("-", "_"): args[i + 1] for i in range(len(args) - 1) if args[i] in (
        "--shard", "--total-shards", "--replicas-per-shard")}  # fmt: skip
    settings = load_settings(
        {**flags, "total_shards": int(flags["total_shards"]), "replicas_per_shard": int(flags["replicas_per_shard"])},
        env={"ARCHIVER_API_TOKEN": TOKEN, "POD_NAME": "arch-archiver-3"},
        config_file=config_file,
    )
    assert settings.shard == Shard(1, 2, 1)


def test_persistence_settings(chart: helm.Chart) -> None:
    sized = render(chart, {**MINIMAL, "persistence": {"size": "50Gi", "storageClass": "gp3"}})
    (claim,) = one(sized, "StatefulSet")["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert claim["spec"]["storageClassName"] == "gp3"
    dash = render(chart, {**MINIMAL, "persistence": {"storageClass": "-"}})
    assert one(dash, "StatefulSet")["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == ""
    ephemeral = one(render(chart, {**MINIMAL, "persistence": {"enabled": False}}), "StatefulSet")
    assert "volumeClaimTemplates" not in ephemeral["spec"]
    assert {"name": "state", "emptyDir": {}} in ephemeral["spec"]["template"]["spec"]["volumes"]


MIB = 1024 * 1024
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity_bytes(quantity: str | int) -> int:
    """Bytes of a Kubernetes memory quantity (128Mi, 1G, 1048576)."""
    match = _QUANTITY.match(str(quantity))
    assert match, quantity
    return int(float(match[1]) * _UNITS[match[2]])


def scratch_volumes(docs: list[Doc]) -> tuple[list[Doc], list[Doc]]:
    """The StatefulSet pod's memory-backed volumes, and the archiver's mounts of them."""
    pod = one(docs, "StatefulSet")["spec"]["template"]["spec"]
    memory = [v for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
    names = {v["name"] for v in memory}
    return memory, [m for m in container(docs)["volumeMounts"] if m["name"] in names]


def daemon_settings(docs: list[Doc], tmp_path: Path) -> Any:
    """archiver.config.settings' reading of the rendered config.toml, as `archiver run --config` does."""
    from archiver.config.settings import load_settings

    config_file = tmp_path / "config.toml"
    config_file.write_text(one(docs, "ConfigMap", "arch-archiver")["data"]["config.toml"])
    token_file = tmp_path / "api-token"
    token_file.write_text(TOKEN)
    return load_settings({"api_token_file": str(token_file)}, env={}, config_file=config_file)


def test_by_default_running_captures_are_kept_in_a_memory_emptydir_at_the_scratch_dir(
    chart: helm.Chart, tmp_path: Path
) -> None:
    """Defaults: a Memory emptyDir of captureScratchSizeLimit (128Mi) mounted at
    config.follow_logs_scratch_dir, which the daemon reads from config.toml with a scratch bound
    (96MiB) below the emptyDir's size, so a capture spills to the state volume before the tmpfs is
    full; every manifest validates."""
    docs = render(chart, MINIMAL)
    validate_manifests(docs)
    (volume,), (mount,) = scratch_volumes(docs)
    assert volume == {"name": "capture-scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "128Mi"}}
    assert mount == {"name": "capture-scratch", "mountPath": "/var/lib/archiver-scratch"}
    toml = rendered_toml(docs)
    assert toml["follow_logs_scratch_dir"] == "/var/lib/archiver-scratch" == mount["mountPath"]
    assert toml["follow_logs_scratch_size"] == "96MiB"
    settings = daemon_settings(docs, tmp_path)
    assert settings.follow_logs_scratch_dir == Path(mount["mountPath"])
    assert settings.follow_logs_scratch_size == 96 * MIB < quantity_bytes(volume["emptyDir"]["sizeLimit"])
    # Seals wait 20s for their upload before they are synced: under the kernel's 30s writeback.
    assert settings.follow_logs_seal_sync_delay == 20.0
    # Not on the state volume, and not in the helm test pod (`archiver check` keeps no captures).
    assert mount["mountPath"] != toml["state_dir"]
    assert "capture-scratch" not in {v["name"] for v in one(docs, "Pod")["spec"]["volumes"]}


def test_default_memory_limit_keeps_the_daemons_512mi_beside_the_scratch(chart: helm.Chart) -> None:
    """The tmpfs pages count against the container's memory limit: the default limit holds the whole
    scratch emptyDir plus the 512Mi the daemon had before it."""
    docs = render(chart, MINIMAL)
    (volume,), _ = scratch_volumes(docs)
    limit = quantity_bytes(container(docs)["resources"]["limits"]["memory"])
    assert limit - quantity_bytes(volume["emptyDir"]["sizeLimit"]) >= 512 * MIB


def test_scratch_dir_and_size_limit_follow_values(chart: helm.Chart, tmp_path: Path) -> None:
    """Another scratch dir moves the mount and the config key together; captureScratchSizeLimit
    sizes the emptyDir; follow_logs_scratch_size reaches the daemon."""
    values = {
        **MINIMAL,
        "config": {
            **MINIMAL["config"],
            "follow_logs_scratch_dir": "/run/archiver/captures",
            "follow_logs_scratch_size": "400MiB",
        },
        "captureScratchSizeLimit": "512Mi",
    }
    docs = render(chart, values)
    validate_manifests(docs)
    (volume,), (mount,) = scratch_volumes(docs)
    assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": "512Mi"}
    assert mount["mountPath"] == "/run/archiver/captures" == rendered_toml(docs)["follow_logs_scratch_dir"]
    settings = daemon_settings(docs, tmp_path)
    assert settings.follow_logs_scratch_dir == Path("/run/archiver/captures")
    assert settings.follow_logs_scratch_size == 400 * MIB


def test_scratch_dir_null_keeps_captures_on_the_state_volume_without_a_memory_volume(
    chart: helm.Chart, tmp_path: Path
) -> None:
    """config.follow_logs_scratch_dir: null turns the scratch off: no Memory emptyDir, no mount, no
    key in config.toml, and the daemon writes running captures in the state dir."""
    values = {**MINIMAL, "config": {**MINIMAL["config"], "follow_logs_scratch_dir": None}}
    docs = render(chart, values)
    validate_manifests(docs)
    assert scratch_volumes(docs) == ([], [])
    pod = one(docs, "StatefulSet")["spec"]["template"]["spec"]
    assert "capture-scratch" not in {v["name"] for v in pod["volumes"]}
    assert "capture-scratch" not in {m["name"] for m in container(docs)["volumeMounts"]}
    assert "/var/lib/archiver-scratch" not in {m["mountPath"] for m in container(docs)["volumeMounts"]}
    assert "follow_logs_scratch_dir" not in rendered_toml(docs)
    assert daemon_settings(docs, tmp_path).follow_logs_scratch_dir is None


@pytest.mark.parametrize("scratch", ["/var/lib/archiver", "/var/lib/archiver/", "/tmp", "relative/dir", ""])
def test_a_scratch_dir_that_is_not_a_directory_of_its_own_is_refused(chart: helm.Chart, scratch: str) -> None:
    """The state volume's or /tmp's mount point, or a path that is not absolute, fails the render
    naming the key (Kubernetes would refuse a second mount at the same path)."""
    values = {**MINIMAL, "config": {**MINIMAL["config"], "follow_logs_scratch_dir": scratch}}
    with pytest.raises(helm.HelmError, match="follow_logs_scratch_dir"):
        chart.render(values, name="arch")


def test_all_features_wire_web_config_servicemonitor_and_irsa(chart: helm.Chart) -> None:
    docs = render(chart, ALL_FEATURES)
    c = container(docs)
    args = c["args"]
    assert args[args.index("--web.config.file") + 1] == "/etc/archiver/web/web-config.yml"
    web = one(docs, "Secret", "arch-archiver-web-config")
    assert yaml.safe_load(base64.b64decode(web["data"]["web-config.yml"])) == ALL_FEATURES["webConfig"]
    # TLS in the web config: probes and scrapes switch to HTTPS.
    assert c["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    sm = one(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "http-metrics" and endpoint["path"] == "/metrics"
    assert endpoint["scheme"] == "https" and endpoint["interval"] == "30s"
    service = one(docs, "Service")
    selector = sm["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    # No jobLabel: the operator names the job after the Service, one job per release.
    assert "jobLabel" not in sm["spec"]
    sa = one(docs, "ServiceAccount")
    assert sa["metadata"]["annotations"] == ALL_FEATURES["serviceAccount"]["annotations"]
    assert rendered_toml(docs)["images"] == ALL_FEATURES["config"]["images"]


def test_service_monitor_and_prometheus_rule_take_labels_under_one_name(chart: helm.Chart) -> None:
    """`additionalLabels` on both objects; the ServiceMonitor's 1.0 spelling `labels` still applies
    (deprecated), and the new key wins on a clash."""
    release = {"release": "kube-prometheus-stack"}
    both = {"enabled": True, "additionalLabels": release}
    docs = render(chart, {**MINIMAL, "serviceMonitor": both, "prometheusRule": {**both, "selector": 'job="a"'}})
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert one(docs, kind)["metadata"]["labels"].items() >= release.items(), kind
    old = render(chart, {**MINIMAL, "serviceMonitor": {"enabled": True, "labels": release}})
    assert one(old, "ServiceMonitor")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    clash = {"enabled": True, "labels": {"release": "old", "team": "games"}, "additionalLabels": release}
    labels = one(render(chart, {**MINIMAL, "serviceMonitor": clash}), "ServiceMonitor")["metadata"]["labels"]
    assert labels["release"] == "kube-prometheus-stack" and labels["team"] == "games"
    validate_manifests(docs)
    # The chart's deprecation line: in the notes of a release that still uses the old name only.
    for monitor, deprecated in ((both, False), ({"enabled": True, "labels": release}, True)):
        rendered = chart.render({**MINIMAL, "serviceMonitor": monitor}, name="arch", namespace="observability")
        notes = next(body for path, body in rendered.items() if path.endswith("NOTES.txt"))
        assert ("DEPRECATED: serviceMonitor.labels" in notes) is deprecated


def test_basic_auth_switches_probes_to_tcp(chart: helm.Chart) -> None:
    """kubelet cannot authenticate, so a basic-auth web config turns the probes into TCP checks."""
    values = {**MINIMAL, "webConfig": {"basic_auth_users": {"prometheus": "$2y$10$abcdefghijklmnopqrstuv"}}}
    c = container(render(chart, values))
    assert c["livenessProbe"]["tcpSocket"] == {"port": "http-metrics"}
    assert "httpGet" not in c["readinessProbe"]


def rule_groups(chart: helm.Chart, values: dict[str, Any]) -> dict[str, Doc]:
    """The rendered PrometheusRule's alerts by name."""
    rule = one(render(chart, values), "PrometheusRule")
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r}


def test_prometheus_rule_with_defaults_is_the_standalone_rules_file(chart: helm.Chart) -> None:
    """The chart's alert template is the source; grafana/alerts/archiver.rules.yml is its rendering
    with default values and the standalone selector, byte for byte (fix: make rules)."""
    from tests.render_rules import RULES, STANDALONE_SELECTOR, render_file

    values = {**ALL_FEATURES, "prometheusRule": {**ALL_FEATURES["prometheusRule"], "selector": STANDALONE_SELECTOR}}
    docs = render(chart, values)
    rule = one(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    source = yaml.safe_load(RULES.read_text())
    assert rule["spec"]["groups"] == source["groups"]
    assert RULES.read_text() == render_file(), "grafana/alerts/archiver.rules.yml is stale: run `make rules`"


def rule_exprs(chart: helm.Chart, values: dict[str, Any]) -> dict[str, str]:
    """Every rule's expression (alerts and recording rules) by its name."""
    rule = one(render(chart, values), "PrometheusRule")
    return {r.get("alert") or r["record"]: r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]}


def selectors_of(expr: str) -> list[str]:
    """The label matchers of every series selector in a PromQL expression (`{...}` contents)."""
    return re.findall(r"\{([^{}]*)\}", expr)


def test_rules_select_this_release_by_default_with_a_service_monitor(chart: helm.Chart) -> None:
    """With the chart's ServiceMonitor, every selector of every rule matches this release's job (the
    Service's name, as the operator labels it without jobLabel) and namespace, so releases sharing a
    Prometheus each alert and record on their own targets only."""
    values = {**MINIMAL, "serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}
    docs = render(chart, values)
    service = one(docs, "Service")["metadata"]["name"]
    assert "jobLabel" not in one(docs, "ServiceMonitor")["spec"]
    exprs = rule_exprs(chart, values)
    assert len(exprs) == 26  # 22 alerts, 4 recording rules
    for name, expr in exprs.items():
        found = selectors_of(expr)
        assert found, name
        for matchers in found:
            assert matchers.startswith(f'job="{service}", namespace="observability"'), (name, matchers)


def test_rule_selector_follows_job_label_and_explicit_selector(chart: helm.Chart) -> None:
    """serviceMonitor.jobLabel names the Service label whose value is the job; an explicit
    prometheusRule.selector (regexes allowed) replaces the computed one everywhere."""
    by_label = {**MINIMAL, "serviceMonitor": {"enabled": True, "jobLabel": "app.kubernetes.io/part-of"},
                "prometheusRule": {"enabled": True}}  # fmt: skip
    assert one(render(chart, by_label), "ServiceMonitor")["spec"]["jobLabel"] == "app.kubernetes.io/part-of"
    expr = rule_exprs(chart, by_label)["ArchiverStoreDown"]
    assert expr == 'archiver_store_up{job="session-archiver", namespace="observability"} == 0'
    explicit = {**by_label, "prometheusRule": {"enabled": True, "selector": 'job=~"games-.*", cluster="eu1"'}}
    for name, expr in rule_exprs(chart, explicit).items():
        assert all(m.startswith('job=~"games-.*", cluster="eu1"') for m in selectors_of(expr)), name
    with pytest.raises(helm.HelmError, match="jobLabel"):
        chart.render({**by_label, "serviceMonitor": {"enabled": True, "jobLabel": "no-such-label"}}, name="arch")


def test_rules_without_a_service_monitor_need_a_selector(chart: helm.Chart) -> None:
    """The chart cannot know the job of a scrape config it did not make: one clear line, no guess."""
    with pytest.raises(helm.HelmRenderError, match=r"prometheusRule\.selector is required") as caught:
        chart.render({**MINIMAL, "prometheusRule": {"enabled": True}}, name="arch")
    assert "\n" not in str(caught.value).strip()
    with pytest.raises(helm.HelmError, match="selector"):
        chart.render({**MINIMAL, "prometheusRule": {"enabled": True, "selector": '{job="x"}'}}, name="arch")


def test_alert_rules_follow_values(chart: helm.Chart) -> None:
    """Per-rule enabled, severity, for and thresholds, extra alert labels and the runbook base URL."""
    values = {
        **MINIMAL,
        "prometheusRule": {
            "enabled": True,
            "selector": SELECTOR,
            "alertLabels": {"team": "games"},
            "runbookBaseUrl": "https://wiki.example.com/archiver",
            "rules": {
                "ArchiverSessionsDropped": {"enabled": False},
                "ArchiverUploadBacklog": {"threshold": 500, "for": "1h", "severity": "critical"},
                "ArchiverFetchDeadlineNear": {"threshold": 3600},
                "ArchiverItemsExpired": {"window": "2h"},
                "ArchiverStoreDown": {"for": "10m"},
            },
        },
    }
    rules = rule_groups(chart, values)
    assert "ArchiverSessionsDropped" not in rules and "ArchiverDown" in rules
    backlog = rules["ArchiverUploadBacklog"]
    assert backlog["expr"] == 'archiver_pending_items{job="archiver", stage="upload"} > 500'
    assert backlog["for"] == "1h" and backlog["labels"] == {"severity": "critical", "team": "games"}
    assert "more than 500 fetched items" in backlog["annotations"]["description"]
    assert rules["ArchiverFetchDeadlineNear"]["expr"].endswith("time() < 3600")
    assert "[2h]) > 0" in rules["ArchiverItemsExpired"]["expr"]
    assert rules["ArchiverStoreDown"]["for"] == "10m"
    assert (
        rules["ArchiverStoreDown"]["annotations"]["runbook_url"]
        == "https://wiki.example.com/archiver#archiverstoredown"
    )


@pytest.mark.parametrize(
    ("persistence", "spool", "expected"),
    [
        ({}, {}, 5 * 1024**3),
        ({"size": "50Gi"}, {}, 25 * 1024**3),
        ({"size": "500M"}, {"volumeFraction": 0.8}, 400_000_000),
        ({"size": "50Gi"}, {"thresholdBytes": 1_000_000}, 1_000_000),
    ],
)
def test_spool_alert_follows_the_volume_size(
    chart: helm.Chart, persistence: dict[str, Any], spool: dict[str, Any], expected: int
) -> None:
    values = {
        **MINIMAL,
        "persistence": persistence,
        "prometheusRule": {"enabled": True, "selector": SELECTOR, "rules": {"ArchiverSpoolLarge": spool}},
    }
    expr = rule_groups(chart, values)["ArchiverSpoolLarge"]["expr"]
    assert expr == f'archiver_spool_bytes{{job="archiver"}} > {expected}'


def test_spool_alert_refuses_an_unreadable_volume_size(chart: helm.Chart) -> None:
    values = {**MINIMAL, "persistence": {"size": "lots"}, "prometheusRule": {"enabled": True, "selector": SELECTOR}}
    with pytest.raises(helm.HelmError, match="lots"):
        chart.render(values, name="arch")


def test_dashboard_configmaps_carry_the_dashboards(chart: helm.Chart) -> None:
    docs = render(chart, ALL_FEATURES)
    maps = [d for d in docs if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]]
    sources = {p.name: json.loads(p.read_text()) for p in (GRAFANA / "dashboards").glob("*.json")}
    assert len(maps) == len(sources) == 2
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "Session archiver"}
        ((name, body),) = cm["data"].items()
        assert json.loads(body) == sources[name]


def test_chart_copies_equal_the_grafana_sources() -> None:
    """helm/archiver/files/dashboards holds byte-identical copies (fix: cp grafana/dashboards/*.json
    helm/archiver/files/dashboards/)."""
    sources = sorted(p.name for p in (GRAFANA / "dashboards").glob("*.json"))
    copies = sorted(p.name for p in (CHART / "files" / "dashboards").glob("*.json"))
    assert copies == sources and sources
    for name in sources:
        assert (CHART / "files" / "dashboards" / name).read_bytes() == (GRAFANA / "dashboards" / name).read_bytes(), (
            name
        )


# (values added to the minimal ones, the misspelt key)
MISSPELT: list[tuple[dict[str, Any], str]] = [
    ({"serviceMonitr": {"enabled": True}}, "serviceMonitr"),
    ({"image": {"registy": "registry.example.com"}}, "registy"),
    ({"persistence": {"sise": "20Gi"}}, "sise"),
    ({"prometheusRule": {"rules": {"ArchiverStoreDwn": {"enabled": False}}}}, "ArchiverStoreDwn"),
    ({"prometheusRule": {"rules": {"ArchiverStoreDown": {"treshold": 1}}}}, "treshold"),
    ({"securityContext": {"readOnlyRootFileSystem": True}}, "readOnlyRootFileSystem"),
    ({"livenessProbe": {"periodSecond": 10}}, "periodSecond"),
    ({"networkPolicy": {"egres": []}}, "egres"),
    ({"helmTest": {"enable": False}}, "enable"),
    ({"config": {"poll_intervall": "5s"}}, "poll_intervall"),
]


@pytest.mark.parametrize(("typo", "misspelt"), MISSPELT, ids=[key for _, key in MISSPELT])
def test_values_with_a_misspelt_key_are_refused(chart: helm.Chart, typo: dict[str, Any], misspelt: str) -> None:
    """values.schema.json closes every level: a typo fails the render and lint, naming the key,
    instead of rendering the default silently."""
    values = {**MINIMAL, **{k: {**MINIMAL.get(k, {}), **v} for k, v in typo.items()}}
    with pytest.raises(helm.HelmError, match=f"additional properties '{misspelt}' not allowed"):
        chart.render(values, name="arch")
    report = helm.lint(CHART, values, strict=True)
    assert any(misspelt in str(m) for m in report["errors"] + report["messages"]), report


def test_ci_values_files_pass_the_schema(chart: helm.Chart) -> None:
    """Both CI values files (all features on) satisfy the closed schema."""
    for values in (MINIMAL, ALL_FEATURES):
        assert render(chart, values)


def test_helm_test_pod_runs_archiver_check_with_the_daemon_config(chart: helm.Chart) -> None:
    """`helm test` fails when the store or token is broken: its pod runs `archiver check` with the
    same config file, token Secret, service account, env and extra mounts as the daemon."""
    docs = render(chart, ALL_FEATURES)
    pod = one(docs, "Pod")
    sts_pod = one(docs, "StatefulSet")["spec"]["template"]["spec"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    (check,) = pod["spec"]["containers"]
    daemon = sts_pod["containers"][0]
    assert check["args"] == ["check", "--config", "/etc/archiver/config.toml", "--api-token-file", TOKEN_FILE]
    assert check["image"] == daemon["image"]
    assert check.get("env") == daemon.get("env")
    assert pod["spec"]["serviceAccountName"] == sts_pod["serviceAccountName"]
    assert check["securityContext"] == daemon["securityContext"]
    assert pod["spec"]["securityContext"] == sts_pod["securityContext"]
    mounts = {m["name"]: m for m in check["volumeMounts"]}
    daemon_mounts = {m["name"]: m for m in daemon["volumeMounts"]}
    for name in ("config", "api-token", "tmp", "tls"):
        assert mounts[name] == daemon_mounts[name], name
    assert mounts["state"]["mountPath"] == rendered_toml(docs)["state_dir"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    daemon_volumes = {v["name"]: v for v in sts_pod["volumes"]}
    for name in ("config", "api-token", "tls"):
        assert volumes[name] == daemon_volumes[name], name
    # Not an endpoint of the metrics Service, not under the NetworkPolicy.
    selector = one(docs, "Service")["spec"]["selector"]
    assert not selector.items() <= pod["metadata"]["labels"].items()
    assert [d for d in render(chart, {**MINIMAL, "helmTest": {"enabled": False}}) if d["kind"] == "Pod"] == []


def test_image_reference_registry_and_global_override(chart: helm.Chart) -> None:
    def image(values: dict[str, Any]) -> str:
        found: str = container(render(chart, {**MINIMAL, **values}))["image"]
        return found

    assert image({}) == "ghcr.io/session-archiver/archiver:1.0.0"
    assert image({"image": {"registry": "registry.example.com/mirror/"}}) == (
        "registry.example.com/mirror/session-archiver/archiver:1.0.0"
    )
    assert image({"global": {"imageRegistry": "mirror.local"}, "image": {"tag": "0.2.0"}}) == (
        "mirror.local/session-archiver/archiver:0.2.0"
    )
    digest = "sha256:" + "ab" * 32
    assert image({"image": {"registry": "", "repository": "me/arch", "digest": digest}}) == f"me/arch@{digest}"


def test_common_labels_reach_every_object_but_not_the_selectors(chart: helm.Chart) -> None:
    docs = render(chart, {**ALL_FEATURES, "commonLabels": {"team": "games", "cost-center": "42"}})
    for doc in docs:
        assert doc["metadata"]["labels"]["team"] == "games", doc["kind"]
        assert doc["metadata"]["labels"]["cost-center"] == "42", doc["kind"]
    sts = one(docs, "StatefulSet")
    assert "team" not in sts["spec"]["selector"]["matchLabels"]
    assert sts["spec"]["template"]["metadata"]["labels"]["team"] == "games"
    with pytest.raises(helm.HelmError, match=r"app\.kubernetes\.io/name"):
        chart.render({**MINIMAL, "commonLabels": {"app.kubernetes.io/name": "x"}}, name="arch")


def test_startup_probe_revision_history_and_network_policy(chart: helm.Chart) -> None:
    docs = render(chart, MINIMAL)
    c = container(docs)
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http-metrics", "scheme": "HTTP"}
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 300
    assert "initialDelaySeconds" not in c["livenessProbe"]  # the start-up probe holds it off instead
    assert one(docs, "StatefulSet")["spec"]["revisionHistoryLimit"] == 5
    assert "startupProbe" not in container(render(chart, {**MINIMAL, "startupProbe": None}))
    assert [d for d in docs if d["kind"] == "NetworkPolicy"] == []

    policy = one(render(chart, ALL_FEATURES), "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == one(docs, "Service")["spec"]["selector"]
    (ingress,) = policy["spec"]["ingress"]
    assert ingress["ports"] == [{"port": "http-metrics", "protocol": "TCP"}]
    assert ingress["from"] == ALL_FEATURES["networkPolicy"]["ingressFrom"]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    egress = policy["spec"]["egress"]
    assert egress[:-1] == ALL_FEATURES["networkPolicy"]["egress"]
    assert {"port": 53, "protocol": "UDP"} in egress[-1]["ports"]


def test_chart_defaults_match_the_image_contract() -> None:
    """The Dockerfile's user, entrypoint, state dir and port are what the chart's defaults assume."""
    dockerfile = (REPO / "Dockerfile").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def instruction(name: str) -> str:
        # The last one: the runtime stage's.
        lines = [ln for ln in dockerfile.splitlines() if ln.startswith(f"{name} ")]
        return lines[-1].split(" ", 1)[1].strip()

    user, group = instruction("USER").split(":")
    assert int(user) == values["podSecurityContext"]["runAsUser"] == values["podSecurityContext"]["fsGroup"]
    assert int(group) == values["podSecurityContext"]["runAsGroup"]
    assert json.loads(instruction("ENTRYPOINT")) == ["archiver"]  # the chart's args start with a subcommand
    assert instruction("WORKDIR") == values["config"]["state_dir"]
    assert json.loads(instruction("VOLUME")) == [values["config"]["state_dir"]]
    port = values["config"]["web_listen_address"].rsplit(":", 1)[1]
    assert instruction("EXPOSE") == port == str(values["service"]["port"])
    assert values["securityContext"]["readOnlyRootFilesystem"] is True
    reference = f"{values['image']['registry']}/{values['image']['repository']}"
    assert reference == "ghcr.io/session-archiver/archiver"
    # `make image` (what the README tells users to run) builds what the chart pulls.
    assert f"IMAGE ?= {reference}\n" in (REPO / "Makefile").read_text()
    assert f"{reference}:" in (REPO / "README.md").read_text()


@pytest.mark.parametrize("store_alive", [True, False], ids=["store-ok", "store-unreachable"])
def test_helm_test_pod_command_fails_when_the_store_is_unreachable(
    chart: helm.Chart,
    fake_service: FakeService,
    s3_bucket: tuple[str, str],
    tmp_path: Path,
    store_alive: bool,
) -> None:
    """What `helm test` runs, run here: the check pod's own args and env, with its ConfigMap and
    token Secret where the pod mounts them, against the fake upstream and a moto S3 store (alive, or
    a closed port). It exits 0 only while the store works, so `helm test` fails on a dead store."""
    endpoint, bucket = s3_bucket
    state_dir = tmp_path / "state"
    values = {
        **MINIMAL,
        "config": {
            "api_url": fake_service.base_url,
            "store": f"s3://{bucket}/archive/",
            "s3_endpoint_url": endpoint if store_alive else f"http://127.0.0.1:{free_port()}",
            "state_dir": str(state_dir),
        },
        "extraEnv": [{"name": "AWS_DEFAULT_REGION", "value": "us-east-1"}],
    }
    docs = render(chart, values)
    (check,) = one(docs, "Pod")["spec"]["containers"]
    mounted = {
        "/etc/archiver/config.toml": tmp_path / "config.toml",
        TOKEN_FILE: tmp_path / "api-token",
    }
    mounted["/etc/archiver/config.toml"].write_text(one(docs, "ConfigMap", "arch-archiver")["data"]["config.toml"])
    mounted[TOKEN_FILE].write_text(TEST_TOKEN)
    args = [str(mounted.get(arg, arg)) for arg in check["args"]]
    env = {**os.environ, **{e["name"]: e["value"] for e in check["env"]}}
    env = {k: v for k, v in env.items() if k != "ARCHIVER_API_TOKEN"}
    result = subprocess.run(
        [str(Path(sys.executable).parent / "archiver"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    output = result.stdout + result.stderr
    assert TEST_TOKEN not in output
    if store_alive:
        assert result.returncode == 0, output
        assert "verdict: READY" in output
    else:
        assert result.returncode != 0, output
        assert "NOT READY" in output and "store reachable" in output


def test_archiver_check_in_the_pod_needs_no_flags(
    chart: helm.Chart, fake_service: FakeService, s3_bucket: tuple[str, str], tmp_path: Path
) -> None:
    """`kubectl exec <pod> -- archiver check`: the archiver container's environment alone (its config
    and token file paths, where the pod mounts them) makes the real CLI find the upstream, the token
    and the store, with no flag; without that environment the same command finds no upstream."""
    endpoint, bucket = s3_bucket
    values = {
        **MINIMAL,
        "config": {
            "api_url": fake_service.base_url,
            "store": f"s3://{bucket}/archive/",
            "s3_endpoint_url": endpoint,
            "state_dir": str(tmp_path / "state"),
        },
        "extraEnv": [{"name": "AWS_DEFAULT_REGION", "value": "us-east-1"}],
    }
    docs = render(chart, values)
    mounted = {"/etc/archiver/config.toml": tmp_path / "config.toml", TOKEN_FILE: tmp_path / "api-token"}
    mounted["/etc/archiver/config.toml"].write_text(one(docs, "ConfigMap", "arch-archiver")["data"]["config.toml"])
    mounted[TOKEN_FILE].write_text(TEST_TOKEN)
    pod_env = {e["name"]: str(mounted.get(e["value"], e["value"])) for e in container(docs)["env"]}
    assert {"ARCHIVER_CONFIG", "ARCHIVER_API_TOKEN_FILE"} <= pod_env.keys()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ARCHIVER_")}
    archiver = str(Path(sys.executable).parent / "archiver")

    def check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([archiver, "check"], capture_output=True, text=True, timeout=120, env=env, check=False)

    in_pod = check({**clean, **pod_env})
    assert in_pod.returncode == 0, in_pod.stdout + in_pod.stderr
    assert "verdict: READY" in in_pod.stdout
    assert TEST_TOKEN not in in_pod.stdout + in_pod.stderr
    bare = check({**clean, "AWS_DEFAULT_REGION": "us-east-1"})
    assert bare.returncode != 0 and "no upstream configured" in bare.stdout + bare.stderr
