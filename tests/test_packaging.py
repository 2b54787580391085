"""Package hygiene: one version (pyproject.toml, read back through importlib.metadata), the metadata a
package index shows, the typing marker, and an sdist that carries what the tests need."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import re
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

from click.testing import CliRunner

import archiver
from archiver.cli import main

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_version_lives_in_pyproject_only() -> None:
    """`archiver.__version__` is the installed distribution's, which is pyproject's; no second copy."""
    assert archiver.__version__ == importlib.metadata.version("session-archiver") == PYPROJECT["project"]["version"]
    source = (REPO / "archiver" / "__init__.py").read_text()
    assert PYPROJECT["project"]["version"] not in source


def test_version_flags() -> None:
    for flag in ("-V", "--version"):
        result = CliRunner().invoke(main, [flag])
        assert result.exit_code == 0, result.output
        assert result.output.strip() == f"archiver, version {archiver.__version__}"


def test_installed_metadata() -> None:
    """SPDX licence expression, classifiers and project URLs reach the installed metadata."""
    meta = importlib.metadata.metadata("session-archiver")
    assert meta["License-Expression"] == "Apache-2.0"
    classifiers = meta.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")]  # superseded by the SPDX expression
    urls = dict(entry.split(", ", 1) for entry in meta.get_all("Project-URL") or [])
    assert urls["Source"] == "https://github.com/session-archiver/session-archiver"
    assert urls["Changelog"].endswith("/CHANGELOG.md")


def test_typing_marker_is_shipped() -> None:
    """The fake service's pytest plugin is public: users' mypy sees archiver's types (PEP 561)."""
    assert importlib.resources.files("archiver").joinpath("py.typed").is_file()
    files = importlib.metadata.files("session-archiver") or []
    # An editable install lists no package files; a wheel install must list py.typed.
    if any(str(f).startswith("archiver/") for f in files):
        assert any(str(f) == "archiver/py.typed" for f in files)


def test_changelog_has_an_unreleased_section_and_the_current_version() -> None:
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert re.search(r"^## \[Unreleased\]$", changelog, re.M)
    assert re.search(
        rf"^## \[{re.escape(PYPROJECT['project']['version'])}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M
    )


def test_sdist_carries_the_tests_and_their_data(tmp_path: Path) -> None:
    """A downstream packager can run the tests from the sdist alone: tests/, tests/data (the OpenAPI
    document, the CRD schemas), the chart and alert files they read, and the typing marker."""
    result = subprocess.run(
        [sys.executable, "-c", f"from setuptools import build_meta; print(build_meta.build_sdist({str(tmp_path)!r}))"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    name = result.stdout.strip().splitlines()[-1]
    with tarfile.open(tmp_path / name) as sdist:
        members = {m.split("/", 1)[1] for m in sdist.getnames() if "/" in m}
    for required in (
        "tests/conftest.py",
        "tests/data/gameye-session-openapi.yml",
        "tests/data/crds/monitoring.coreos.com_v1_servicemonitor.json",
        "tests/data/crds/monitoring.coreos.com_v1_prometheusrule.json",
        "archiver/py.typed",
        "archiver/browse/templates/session.html",
        "grafana/alerts/archiver.rules.yml",
        "grafana/alerts/archiver.rules.test.yml",
        "helm/archiver/values.schema.json",
        "helm/archiver/templates/_alerts.tpl",
        "docs/runbook.md",
        "CHANGELOG.md",
        "LICENSE",
        "Dockerfile",
    ):
        assert required in members, required
    assert not [m for m in members if "__pycache__" in m or m.endswith(".pyc")]


def test_chart_app_version_is_the_package_version() -> None:
    """The chart deploys the image tag of its appVersion: the release the package says it is."""
    import yaml

    chart = yaml.safe_load((REPO / "helm" / "archiver" / "Chart.yaml").read_text())
    assert chart["appVersion"] == PYPROJECT["project"]["version"]
