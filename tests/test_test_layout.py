"""The test suite's own layout: shared helpers come from tests/support.py (or a fixtures module),
never from a test module."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
BENCHMARKS = TESTS.parent / "benchmarks"


def imported_test_modules(path: Path, tests: Path) -> list[str]:
    """The test modules of ``tests`` (``test_*.py``, by stem) that the module at ``path`` imports,
    anywhere in it: ``from tests.test_x import ...``, ``import tests.test_x``, ``from tests import
    test_x``, and, for a module inside ``tests``, the relative forms and the bare ``import test_x``."""
    inside = path.parent == tests
    found: list[str] = []

    def note(module: str) -> None:
        if module.startswith("test_") and (tests / f"{module}.py").is_file() and module != path.stem:
            found.append(module)

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "tests" and len(parts) > 1:
                    note(parts[1])
                elif inside:
                    note(parts[0])
        elif isinstance(node, ast.ImportFrom):
            parts = node.module.split(".") if node.module else []
            if node.level == 0 and parts[:1] == ["tests"]:
                parts = parts[1:]
            elif not (inside and node.level <= 1):
                continue  # another package, or above tests/
            if parts:
                note(parts[0])
            else:  # `from tests import a, b` or `from . import a, b`: each name may be a module
                for alias in node.names:
                    note(alias.name)
    return found


def test_nothing_imports_a_test_module() -> None:
    """Helpers that two modules share live in tests/support.py (plain helpers) or tests/fixtures_*.py
    (fixtures); importing a test module would run its module-level code, collect its fixtures and
    tie the two together. The benchmarks, which reuse test helpers, are held to the same rule."""
    modules = [*sorted(TESTS.glob("*.py")), *sorted(BENCHMARKS.glob("*.py"))]
    assert len(modules) > 60
    offenders = {
        str(path.relative_to(TESTS.parent)): imported
        for path in modules
        if (imported := imported_test_modules(path, TESTS))
    }
    assert offenders == {}


def test_the_scan_finds_every_form_of_importing_a_test_module(tmp_path: Path) -> None:
    """The check above can fail: each way of reaching a test module is seen, inside a function too,
    and imports of helpers, fixtures, other packages and the module itself are not."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_other.py").write_text("X = 1\n")
    (tests / "support.py").write_text("Y = 1\n")
    forms = [
        "from tests.test_other import X",
        "import tests.test_other",
        "from tests import test_other",
        "from tests import support, test_other",
        "from .test_other import X",
        "from . import test_other",
        "import test_other",
        "def helper():\n    from tests.test_other import X\n    return X",
    ]
    for n, form in enumerate(forms):
        module = tests / f"test_importer_{n}.py"
        module.write_text(form + "\n")
        assert imported_test_modules(module, tests) == ["test_other"], form
    clean = tests / "test_clean.py"
    clean.write_text(
        "from tests.support import Y\nfrom tests import support\nimport tests.fixtures_fake\n"
        "from tests.test_clean import Z\nfrom ..test_other import X\nfrom other.test_other import X\nimport pytest\n"
    )
    assert imported_test_modules(clean, tests) == []

    benchmark = tmp_path / "bench.py"
    benchmark.write_text("import test_other\nfrom tests import support\n")
    assert imported_test_modules(benchmark, tests) == []  # not inside tests/: `test_other` is not ours
    benchmark.write_text("from tests.test_other import X\n")
    assert imported_test_modules(benchmark, tests) == ["test_other"]
