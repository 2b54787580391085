"""One version, pyproject.toml's, everywhere a user reads one: the installed package's metadata,
`archiver --version`, the `archiver_build_info` metric, the evidence browser's page footer, the Helm
chart (`version`, `appVersion` and the image tag it deploys by default) and the image label (the
Dockerfile takes it from the build argument `make image` passes, and refuses any other)."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import helm_python as helm
import httpx
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import archiver
from archiver.browse.app import BrowseApp
from archiver.browse.server import BrowseServer
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.store import open_store
from tests.support import ARCHIVER, CHART, MINIMAL, REPO, one, render

VERSION: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_the_version_is_a_release_number() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION), VERSION


def test_the_installed_package_and_archiver_version_say_pyprojects_version() -> None:
    assert importlib.metadata.version("session-archiver") == archiver.__version__ == VERSION
    # The console script the install made, in a process of its own.
    result = subprocess.run([ARCHIVER, "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"archiver, version {VERSION}"


def test_the_build_info_metric_carries_pyprojects_version() -> None:
    registry = CollectorRegistry()
    SelfMetrics(registry)
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    (sample,) = families["archiver_build_info"].samples
    assert sample.labels["version"] == VERSION and sample.value == 1


def test_every_evidence_browser_page_shows_pyprojects_version_in_its_footer(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}")
    with BrowseServer(("127.0.0.1", 0), BrowseApp(store)) as server, httpx.Client(base_url=server.url) as client:
        for path, status in (("/sessions", 200), ("/sessions/no-such-session", 404)):
            page = client.get(path)
            assert page.status_code == status
            assert re.findall(r"<footer>(.*?)</footer>", page.text, re.S) == [f"session-archiver {VERSION}"]


def test_the_chart_is_released_as_pyprojects_version_and_deploys_that_image() -> None:
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (meta["version"], meta["appVersion"]) == (VERSION, VERSION)
    with helm.Chart.load(CHART) as chart:
        statefulset = one(render(chart, MINIMAL), "StatefulSet")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    assert container["image"].endswith(f"/archiver:{VERSION}")  # image.tag empty: the appVersion
    assert statefulset["metadata"]["labels"]["app.kubernetes.io/version"] == VERSION


def test_the_image_label_is_the_version_make_image_passes_and_the_build_checks() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    runtime_stage = dockerfile.rsplit("\nFROM ", 1)[1]
    assert 'org.opencontainers.image.version="${VERSION}"' in runtime_stage
    # No second copy of the version to drift: unpassed, the label says so.
    assert re.findall(r"^ARG VERSION=(.*)$", dockerfile, re.M) == ["unknown", "unknown"]
    # The build stage compares a passed VERSION with what `archiver --version` of the built package says.
    assert '[ "$built" != "archiver, version $VERSION" ]' in dockerfile.split("\nFROM ")[1]
    planned = subprocess.run(
        ["make", "-n", "image", "PYTHON=" + sys.executable], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert planned.returncode == 0, planned.stderr
    assert f"--build-arg VERSION={VERSION} " in planned.stdout
    assert f"archiver:{VERSION} " in planned.stdout
