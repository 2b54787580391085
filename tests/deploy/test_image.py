"""The container image (top-level Dockerfile) builds, honours its contract and archives sessions when run.

No image registry is reachable in CI, so the base is made here: mmdebstrap builds a Debian bookworm
rootfs (python3, python3-venv, ca-certificates) from Debian packages, buildah turns it into a local
image, and the Dockerfile is built on it with `--build-arg BASE=...` (the same Dockerfile whose
default base is the public python:3.11-slim-bookworm). Everything lives in a buildah storage root
under the test's temp dir (vfs driver, chroot isolation: no daemon, no overlay mounts, nothing left on
the machine). The build's RUN steps reach PyPI for the dependencies.

Slow (a few minutes), so it is marked `image` and left out of `make test`; `make test-image` and CI
run it. Under CI=true a missing buildah or mmdebstrap is a failure, never a skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.image

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
BASE_IMAGE = "localhost/archiver-test-base:bookworm"
IMAGE = "localhost/session-archiver:test"
BASE_PACKAGES = ["python3", "python3-venv", "ca-certificates"]
# Where a developer can keep a base rootfs between runs (mmdebstrap takes ~30-60 s): a path to a
# tarball, created when missing.
BASE_TAR_ENV = "ARCHIVER_TEST_BASE_TAR"


def _require(condition: bool, why: str) -> None:
    """A missing prerequisite fails under CI=true (CI installs it) and skips on a developer machine."""
    if condition:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} (CI must install it: see .ci/run)")
    pytest.skip(why)


@dataclass
class Buildah:
    """buildah with a private storage root: vfs (no overlay mounts needed) and chroot isolation."""

    root: Path

    def __call__(self, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [
            "buildah",
            "--root",
            str(self.root / "storage"),
            "--runroot",
            str(self.root / "run"),
            "--storage-driver",
            "vfs",
            *args,
        ]
        env = {**os.environ, "BUILDAH_ISOLATION": "chroot"}
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result


@dataclass
class BuiltImage:
    buildah: Buildah
    build_seconds: float
    inspect: dict[str, Any]
    size_bytes: int


def _size_bytes(human: str) -> int:
    """buildah's image size ("276 MB": decimal units, as go-units prints them) in bytes."""
    match = re.fullmatch(r"([0-9.]+)\s*([kMGT]?B)", human.strip())
    assert match, human
    return int(float(match.group(1)) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[match.group(2)])


def _base_tarball(tmp: Path) -> Path:
    cached = os.environ.get(BASE_TAR_ENV)
    target = Path(cached) if cached else tmp / "base.tar"
    if target.exists():
        return target
    partial = target.with_name(target.name + ".partial")
    # minbase: essential packages only; the host's apt sources (a Debian mirror) are the mirror.
    result = subprocess.run(
        [
            "mmdebstrap",
            "--variant=minbase",
            "--format=tar",
            f"--include={','.join(BASE_PACKAGES)}",
            "bookworm",
            str(partial),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    partial.rename(target)
    return target


def _ca_secret() -> list[str]:
    """The host's CA bundle as the Dockerfile's optional `build-ca` secret, for pip behind a
    TLS-inspecting proxy (mounted for the pip step only, never in a layer)."""
    for candidate in (
        os.environ.get("PIP_CERT"),
        os.environ.get("SSL_CERT_FILE"),
        os.environ.get("REQUESTS_CA_BUNDLE"),
        "/etc/ssl/certs/ca-certificates.crt",
    ):
        if candidate and Path(candidate).is_file():
            return ["--secret", f"id=build-ca,src={candidate}"]
    return []


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltImage]:
    _require(shutil.which("buildah") is not None, "buildah is not installed (Debian package buildah)")
    _require(shutil.which("mmdebstrap") is not None, "mmdebstrap is not installed (Debian package mmdebstrap)")
    _require(os.geteuid() == 0, "building the base rootfs and the image needs root (chroot isolation)")
    tmp = tmp_path_factory.mktemp("image")
    buildah = Buildah(tmp / "buildah")
    try:
        base_tar = _base_tarball(tmp)
        # The rootfs tarball becomes a one-layer local image (buildah add unpacks a local tar).
        container = buildah("from", "scratch").stdout.strip()
        buildah("add", container, str(base_tar), "/")
        buildah("config", "--cmd", "/bin/sh", container)
        buildah("commit", "--rm", container, BASE_IMAGE)

        started = time.monotonic()
        buildah(
            "bud",
            "--isolation",
            "chroot",
            "--pull=never",
            "--layers=false",
            *_ca_secret(),
            "--build-arg",
            f"BASE={BASE_IMAGE}",
            "--build-arg",
            f"VERSION={VERSION}",  # as `make image` passes it
            "-f",
            str(REPO / "Dockerfile"),
            "-t",
            IMAGE,
            str(REPO),
            timeout=1500,
        )
        build_seconds = time.monotonic() - started
        inspect = json.loads(buildah("inspect", "--type", "image", IMAGE).stdout)
        images = json.loads(buildah("images", "--json").stdout)
        (entry,) = [i for i in images if IMAGE in (i.get("names") or [])]
        built = BuiltImage(buildah, build_seconds, inspect, _size_bytes(entry["size"]))
        print(f"\nimage {IMAGE}: built in {build_seconds:.0f} s, {built.size_bytes / 1e6:.1f} MB")
        yield built
    finally:
        # vfs layers are plain directories: remove them (and any container) so the machine is left clean.
        subprocess.run(
            ["buildah", "--root", str(tmp / "buildah" / "storage"), "--runroot", str(tmp / "buildah" / "run"),
             "--storage-driver", "vfs", "rm", "--all"],
            capture_output=True, timeout=300, check=False,
        )  # fmt: skip
        subprocess.run(
            ["buildah", "--root", str(tmp / "buildah" / "storage"), "--runroot", str(tmp / "buildah" / "run"),
             "--storage-driver", "vfs", "rmi", "--all", "--force"],
            capture_output=True, timeout=300, check=False,
        )  # fmt: skip
        shutil.rmtree(tmp / "buildah", ignore_errors=True)


@pytest.fixture
def container(image: BuiltImage) -> Iterator[str]:
    name = image.buildah("from", "--pull=never", IMAGE).stdout.strip()
    yield name
    image.buildah("rm", name, check=False)


def run_in(
    image: BuiltImage, container: str, *command: str, volumes: tuple[str, ...] = (), timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`buildah run` uses the image's USER and WORKDIR, like a container runtime would."""
    options = [arg for volume in volumes for arg in ("--volume", volume)]
    return image.buildah(
        "run", "--isolation", "chroot", *options, container, "--", *command, timeout=timeout, check=False
    )


def test_image_contract(image: BuiltImage) -> None:
    """Entrypoint, user, working dir, port and OCI labels are what the README and the chart rely on."""
    config = image.inspect["OCIv1"]["config"]
    assert config["Entrypoint"] == ["archiver"]
    assert config["Cmd"] == ["run"]
    assert config["User"] == "65534:65534"
    assert config["WorkingDir"] == "/var/lib/archiver"
    assert "9877/tcp" in config["ExposedPorts"]
    assert "/var/lib/archiver" in config["Volumes"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.source"] == "https://github.com/session-archiver/session-archiver"
    assert not any(k.startswith("ARCHIVER_") for k in (e.split("=", 1)[0] for e in config["Env"])), config["Env"]
    # Only the runtime stage's layers: the build stage (wheel, pip, the source tree) is not in it.
    assert image.size_bytes < 400_000_000, image.size_bytes


def test_archiver_version_runs_as_nobody_and_is_pyprojects(image: BuiltImage, container: str) -> None:
    result = run_in(image, container, "archiver", "--version")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == f"archiver, version {VERSION}"
    who = run_in(image, container, "python3", "-c", "import os, sys; print(os.getuid(), os.getgid(), sys.prefix)")
    assert who.returncode == 0, who.stdout + who.stderr
    assert who.stdout.split() == ["65534", "65534", "/opt/archiver"]


def test_the_image_holds_exactly_the_locked_runtime_packages(image: BuiltImage, container: str) -> None:
    """requirements/runtime.txt, version for version, and the package itself: no pip, no setuptools."""
    locked = dict(re.findall(r"^([a-z0-9.-]+)==([^ ;\\]+)", (REPO / "requirements" / "runtime.txt").read_text(), re.M))
    listing = "import importlib.metadata as m; print('\\n'.join(f'{d.name} {d.version}' for d in m.distributions()))"
    result = run_in(image, container, "python3", "-c", listing)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = (line.split() for line in result.stdout.splitlines())
    installed = {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in lines}
    assert installed == {**locked, "session-archiver": VERSION}


def _tree(root: Path, skip: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """(mtime_ns, size) of every file under a mounted rootfs, except the listed top-level dirs."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = "/" + os.path.relpath(dirpath, root).lstrip(".")
        dirnames[:] = [d for d in dirnames if f"{rel.rstrip('/')}/{d}" not in skip]
        for name in filenames:
            path = Path(dirpath, name)
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue
            found[f"{rel.rstrip('/')}/{name}"] = (st.st_mtime_ns, st.st_size)
    return found


def test_demo_archives_sessions_inside_the_container(image: BuiltImage, container: str, tmp_path: Path) -> None:
    """`archiver demo --duration 20` in the image ends with sessions archived on the state volume, and
    writes nothing outside the state dir and /tmp (what a read-only root filesystem allows)."""
    mount = Path(image.buildah("mount", container).stdout.strip())
    # The state volume, owned by the image's user as fsGroup makes it in Kubernetes.
    state = tmp_path / "state"
    state.mkdir()
    os.chown(state, 65534, 65534)
    # /etc: buildah run bind-mounts its own hosts and resolv.conf there.
    writable = ("/var/lib/archiver", "/tmp", "/proc", "/sys", "/dev", "/run", "/etc")
    before = _tree(mount, writable)
    # 127.0.0.1:0: chroot isolation shares the host's network namespace; never a fixed port.
    result = run_in(
        image,
        container,
        *("archiver", "demo", "--duration", "20", "--web.listen-address", "127.0.0.1:0"),
        volumes=(f"{state}:/var/lib/archiver",),
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Traceback" not in output
    match = re.search(r"summary: (\d+) sessions ended, (\d+) archived", output)
    assert match, output
    assert int(match.group(2)) > 0, output
    archive = state / "demo-archive"
    manifests = list((archive / "sessions").glob("*/*/manifest.json"))  # sessions/{sid}/{instance}/
    assert manifests, output
    assert any(item["outcome"] == "archived" for item in json.loads(manifests[0].read_text())["items"])
    after = _tree(mount, writable)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert changed == [], changed
