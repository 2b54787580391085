"""The test suite's own layout: shared helpers come from tests/support.py (or a fixtures module),
never from a test module."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
BENCHMARKS = TESTS.parent / "benchmarks"


def module_names_below(tests: Path) -> set[str]:
    """The dotted names (``tests.room.test_x``) of every test module below ``tests``."""
    return {
        ".".join((tests.name, *path.relative_to(tests).with_suffix("").parts))
        for path in tests.rglob("test_*.py")
        if "data" not in path.relative_to(tests).parts
    }


def imported_test_modules(path: Path, tests: Path) -> list[str]:
    """The test modules below ``tests`` (``test_*.py``, by dotted name) that the module at ``path``
    imports, anywhere in it: ``from tests.room.test_x import ...``, ``import tests.room.test_x``,
    ``from tests.room import test_x``, and, for a module inside ``tests``, the relative forms and
    the bare ``import test_x`` of a sibling."""
    names = module_names_below(tests)
    inside = tests in path.parents
    package = ".".join((tests.name, *path.parent.relative_to(tests).parts)) if inside else ""
    own = f"{package}.{path.stem}" if inside else ""
    found: list[str] = []

    def note(module: str) -> None:
        if module in names and module != own:
            found.append(module)

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                note(alias.name)
                if inside:
                    note(f"{package}.{alias.name}")
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            elif inside:
                up = package.split(".")
                if node.level - 1 >= len(up):
                    continue  # above tests/
                base = ".".join(up[: len(up) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                continue
            note(base)
            for alias in node.names:  # `from tests.room import a, b`: each name may be a module
                note(f"{base}.{alias.name}")
    return found


def test_nothing_imports_a_test_module() -> None:
    """Helpers that two modules share live in tests/support.py (plain helpers) or tests/fixtures_*.py
    (fixtures); importing a test module would run its module-level code, collect its fixtures and
    tie the two together. The benchmarks, which reuse test helpers, are held to the same rule."""
    modules = [*sorted(p for p in TESTS.rglob("*.py") if "data" not in p.parts), *sorted(BENCHMARKS.glob("*.py"))]
    assert len(modules) > 60
    offenders = {
        str(path.relative_to(TESTS.parent)): imported
        for path in modules
        if (imported := imported_test_modules(path, TESTS))
    }
    assert offenders == {}


def test_the_tests_mirror_the_rooms_of_the_package() -> None:
    """Every test module lives in a folder named after the room of ``archiver/`` it tests (or in
    ``ground/`` for the top-level modules, ``deploy/`` for the chart, dashboards and image,
    ``project/`` for the repository as a whole); no test module sits loose in ``tests/``."""
    package = TESTS.parent / "archiver"
    rooms = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    folders = {p.parent.name for p in TESTS.rglob("test_*.py") if "data" not in p.relative_to(TESTS).parts}
    assert not list(TESTS.glob("test_*.py"))
    assert folders - rooms <= {"ground", "deploy", "project"}, folders - rooms
    assert rooms - {"cli"} <= folders, rooms - folders
    for folder in folders:
        assert (TESTS / folder / "__init__.py").is_file(), folder


def test_the_scan_finds_every_form_of_importing_a_test_module(tmp_path: Path) -> None:
    """The check above can fail: each way of reaching a test module is seen, from its own room or
    another, inside a function too, and imports of helpers, fixtures, other packages and the module
    itself are not."""
    tests = tmp_path / "tests"
    (tests / "room").mkdir(parents=True)
    (tests / "other").mkdir()
    (tests / "room" / "test_other.py").write_text("X = 1\n")
    (tests / "support.py").write_text("Y = 1\n")
    forms = {
        "room": [
            "from tests.room.test_other import X",
            "import tests.room.test_other",
            "from tests.room import test_other",
            "from tests.room import support, test_other",
            "from .test_other import X",
            "from . import test_other",
            "import test_other",
            "def helper():\n    from tests.room.test_other import X\n    return X",
        ],
        "other": ["from ..room.test_other import X", "from ..room import test_other", "import tests.room.test_other"],
    }
    for folder, lines in forms.items():
        for n, form in enumerate(lines):
            module = tests / folder / f"test_importer_{n}.py"
            module.write_text(form + "\n")
            assert imported_test_modules(module, tests) == ["tests.room.test_other"], form
            module.unlink()
    clean = tests / "room" / "test_clean.py"
    clean.write_text(
        "from tests.support import Y\nfrom tests import support\nimport tests.fixtures_fake\n"
        "from tests.room.test_clean import Z\nfrom ...test_other import X\nfrom other.test_other import X\n"
        "import pytest\n"
    )
    assert imported_test_modules(clean, tests) == []

    benchmark = tmp_path / "bench.py"
    benchmark.write_text("import test_other\nfrom tests import support\n")
    assert imported_test_modules(benchmark, tests) == []  # not inside tests/: `test_other` is not ours
    benchmark.write_text("from tests.room.test_other import X\n")
    assert imported_test_modules(benchmark, tests) == ["tests.room.test_other"]
