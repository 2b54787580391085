"""The floors of ARCHITECTURE.md §1 (the import-linter contract in `.importlinter`, run by `make lint`):
they hold today, and they fail, naming the import, when a room imports upward or sideways or a module
sits on no floor."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` over the `archiver` package and `.importlinter` found in ``root``."""
    return subprocess.run(
        [LINT_IMPORTS, "--config", str(root / ".importlinter"), "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def copy_of_the_package(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "archiver", tmp_path / "archiver", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / ".importlinter", tmp_path / ".importlinter")
    return tmp_path


def test_the_package_keeps_its_floors() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "added", "named"),
    [
        # the lowest floor reaching for the entry point
        ("archiver/textsafe.py", "import archiver.cli", "archiver.textsafe -> archiver.cli"),
        # a lower room importing a higher one
        ("archiver/store/file.py", "import archiver.app.daemon", "archiver.store.file -> archiver.app.daemon"),
        # two rooms of one floor: neither imports the other
        ("archiver/tlog/leaf.py", "import archiver.fake.clock", "archiver.tlog.leaf -> archiver.fake.clock"),
    ],
)
def test_an_import_against_the_floors_breaks_the_contract_and_is_named(
    tmp_path: Path, module: str, added: str, named: str
) -> None:
    root = copy_of_the_package(tmp_path)
    path = root / module
    path.write_text(path.read_text() + f"\n{added}  # noqa: E402\n")
    result = lint_imports(root)
    assert result.returncode != 0, result.stdout
    assert "0 broken" not in result.stdout, result.stdout
    assert named in result.stdout, result.stdout


def test_a_module_on_no_floor_breaks_the_contract(tmp_path: Path) -> None:
    root = copy_of_the_package(tmp_path)
    (root / "archiver" / "stray.py").write_text('"""A module nobody placed on a floor."""\n')
    result = lint_imports(root)
    assert result.returncode != 0, result.stdout
    assert "archiver.stray" in result.stdout + result.stderr


def test_the_map_draws_the_floors_the_contract_checks() -> None:
    """ARCHITECTURE.md §1's floors, top to bottom, are the layers of the `floors` contract."""
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    contract = [line.strip() for line in config["importlinter:contract:floors"]["layers"].splitlines() if line.strip()]
    text = (REPO / "ARCHITECTURE.md").read_text()
    block = text[text.index("The floors, top to bottom") : text.index("| Room | Modules | Owns |")]
    drawn = [m.group(1) for m in re.finditer(r"^    ([a-z][a-z_ |]*?)(?:  |$)", block, re.MULTILINE)]
    assert drawn == contract
