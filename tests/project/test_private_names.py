"""No code in `archiver/` reaches a private (underscored) name of another package: imports are
scanned from the AST (`import x._y`, `from x._y import z`, `from x import _y`), and so are the
attribute reads the AST can tie to another package or to a string (`module._name`,
`getattr(obj, "_name")`, names looped over into `getattr`). Attribute chains on other packages'
objects held in variables need types to see: they are reviewed by hand."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "archiver"
PROJECT = "archiver"
#: Underscored names of the standard library that its reference documents as public API.
DOCUMENTED = {"os._exit": "the Python library reference documents os._exit (exit without cleanup)"}
_REFLECTION = {"getattr", "setattr", "hasattr", "delattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _foreign(module: str) -> bool:
    return module.split(".")[0] != PROJECT


def private_uses(source: str, filename: str = "<source>") -> list[str]:
    """Every reach into another package's private names in `source`, as 'line: what'."""
    tree = ast.parse(source, filename)
    found: list[str] = []
    modules: dict[str, str] = {}  # local name -> foreign module it is bound to
    looped: dict[str, list[object]] = {}  # loop variable -> the constants it runs over

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _foreign(alias.name):
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"{node.lineno}: import {alias.name}")
                    if alias.asname:
                        modules[alias.asname] = alias.name
                    else:  # `import a.b` binds `a`
                        modules[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _foreign(node.module):
            if any(_private(part) for part in node.module.split(".")):
                found.append(f"{node.lineno}: from {node.module} import ...")
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
        elif (
            isinstance(node, ast.For)
            and isinstance(node.target, ast.Name)
            and isinstance(node.iter, ast.Tuple | ast.List | ast.Set)
        ):
            looped[node.target.id] = [e.value for e in node.iter.elts if isinstance(e, ast.Constant)]

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name):
            module = modules.get(node.value.id)
            if module is not None and f"{module}.{node.attr}" not in DOCUMENTED:
                found.append(f"{node.lineno}: {module}.{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _REFLECTION
            and len(node.args) >= 2
            and not (isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls"))
        ):
            name = node.args[1]
            if isinstance(name, ast.Constant):
                names = [name.value]
            elif isinstance(name, ast.Name):
                names = looped.get(name.id, [])
            else:
                names = []
            found.extend(
                f"{node.lineno}: {node.func.id}(..., {n!r})" for n in names if isinstance(n, str) and _private(n)
            )
    return found


def test_no_module_of_archiver_reaches_a_private_name_of_another_package() -> None:
    sources = sorted(PACKAGE.rglob("*.py"))
    assert len(sources) > 50  # the scan read the package, not an empty folder
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{use}"
        for path in sources
        for use in private_uses(path.read_text(encoding="utf-8"), str(path))
    ]
    assert found == []


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ("import h11._receivebuffer", "import h11._receivebuffer"),
        ("import h11._receivebuffer as rb", "import h11._receivebuffer"),
        ("from h11._receivebuffer import ReceiveBuffer", "from h11._receivebuffer import ..."),
        ("from botocore.config import _S3Dict", "from botocore.config import _S3Dict"),
        ("import httpx\nhttpx._transports", "httpx._transports"),
        ("import sys\nsys._getframe()", "sys._getframe"),
        ("getattr(response.stream, '_stream', None)", "getattr(..., '_stream')"),
        ("setattr(state, '_receive_buffer', b'')", "setattr(..., '_receive_buffer')"),
        (
            "for attribute in ('_stream', '_httpcore_stream'):\n    s = getattr(s, attribute, None)",
            "getattr(..., '_stream')",
        ),
    ],
)
def test_the_scan_flags_each_way_of_reaching_a_private_name(source: str, flagged: str) -> None:
    assert [use.split(": ", 1)[1] for use in private_uses(source)][:1] == [flagged]


def test_the_scan_leaves_the_projects_own_and_public_names_alone() -> None:
    source = textwrap.dedent(
        """
        from __future__ import annotations
        import os
        import archiver._internal
        from archiver.upstream.transport import _DIRECT_READ
        from . import _sibling
        from archiver import __version__
        import httpx
        os._exit(3)
        httpx.__version__
        getattr(self, "_cache", None)
        getattr(response, "extensions")
        getattr(client, name)
        token._path = path
        """
    )
    assert private_uses(source) == []
