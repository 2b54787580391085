"""Package hygiene: one version (pyproject.toml, read back through importlib.metadata), the metadata a
package index shows, the typing marker, an sdist that carries what the tests need, and locks
(requirements/) that pin with hashes every dependency within pyproject's ranges."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.resources
import re
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

from click.testing import CliRunner
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import archiver
from archiver.cli.base import main

REPO = Path(__file__).resolve().parents[2]
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
        "requirements/runtime.txt",
        "requirements/build.txt",
    ):
        assert required in members, required
    assert not [m for m in members if "__pycache__" in m or m.endswith(".pyc")]


def locked(name: str) -> dict[str, str]:
    """The pins of requirements/`name`: project name -> version; each must carry a hash."""
    text = (REPO / "requirements" / name).read_text()
    entries = re.findall(r"^([a-z0-9][a-z0-9.-]*)==(\S+)((?: \\\n\s+--hash=sha256:[0-9a-f]{64})*)", text, re.M)
    assert entries, name
    assert [n for n, _, hashes in entries if not hashes] == [], f"pins without a hash in {name}"
    assert len(entries) == len(re.findall(r"^\S", text, re.M)) - len(re.findall(r"^#", text, re.M))
    return {n: v for n, v, _ in entries}


def _extra(name: str) -> list[Requirement]:
    """An extra's requirements, the project's own extras it names expanded."""
    found = []
    for line in PYPROJECT["project"]["optional-dependencies"][name]:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == "session-archiver":
            found.extend(r for extra in requirement.extras for r in _extra(extra))
        else:
            found.append(requirement)
    return found


LOCKS = {
    "runtime.txt": [Requirement(r) for r in PYPROJECT["project"]["dependencies"]],
    "build.txt": [Requirement(r) for r in PYPROJECT["build-system"]["requires"]],
    "dev.txt": [Requirement(r) for r in PYPROJECT["project"]["dependencies"]] + _extra("dev"),
    "browser-test.txt": [Requirement(r) for r in PYPROJECT["project"]["dependencies"]] + _extra("browser-test"),
}


def test_every_lock_pins_each_requirement_within_pyprojects_range() -> None:
    for name, requirements in LOCKS.items():
        pins = locked(name)
        for requirement in requirements:
            version = pins.get(canonicalize_name(requirement.name))
            assert version is not None, f"{requirement.name} is not locked in {name}"
            assert requirement.specifier.contains(version), f"{name}: {requirement.name}=={version}, not {requirement}"
            # A range the tests prove has an upper bound (the next major, or minor below 1.0).
            assert any(spec.operator == "<" for spec in requirement.specifier), f"{requirement} has no upper bound"


def test_the_test_locks_pin_the_runtime_packages_as_the_image_does() -> None:
    """What the tests run on is what the image installs (dev.txt is locked within runtime.txt)."""
    runtime, build = locked("runtime.txt"), locked("build.txt")
    for name in ("dev.txt", "browser-test.txt"):
        pins = locked(name)
        assert {n: pins.get(n) for n in runtime} == runtime, name
        assert {n: pins.get(n) for n in build} == build, name


def test_each_runtime_dependency_is_imported_by_the_package_and_each_import_declared() -> None:
    """No dependency kept for an import that is gone, and no third-party import that only arrives
    with another package (an undeclared one would install unbounded, whatever the index serves)."""
    imported = set()
    for path in (REPO / "archiver").rglob("*.py"):
        if path.name == "pytest_plugin.py":
            continue  # the fake's plugin for users' pytest: it runs where pytest is
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    providers = importlib.metadata.packages_distributions()
    used = {canonicalize_name(dist) for module in imported for dist in providers.get(module, [])}
    declared = {canonicalize_name(Requirement(r).name) for r in PYPROJECT["project"]["dependencies"]}
    assert declared - used == set()
    assert used - declared - {"session-archiver"} == set()
