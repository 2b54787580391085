"""A user mistake reaches the terminal as one line and a non-zero exit, never as a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from archiver import errors
from archiver.cli import main

ARCHIVER = str(Path(sys.executable).with_name("archiver"))


def test_status_on_a_new_empty_state_dir_is_one_error_line_in_process(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["status", "--state-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: no state DB at ")
    assert "Traceback" not in result.output


def test_status_on_a_new_empty_state_dir_is_one_error_line_as_a_process(tmp_path: Path) -> None:
    result = subprocess.run(
        [ARCHIVER, "status", "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"error: no state DB at {tmp_path / 'state.db'} (has `archiver run` used this --state-dir?)"
    ]


def test_every_exception_in_errors_descends_from_the_root_the_cli_catches() -> None:
    classes = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, BaseException)]
    assert errors.StateError in classes and errors.TooLargeError in classes
    assert all(issubclass(cls, errors.ArchiverError) for cls in classes)


def test_the_errors_docstring_names_every_class_of_the_tree() -> None:
    names = [k for k, v in vars(errors).items() if isinstance(v, type) and issubclass(v, errors.ArchiverError)]
    doc = errors.__doc__ or ""
    assert [name for name in names if name not in doc] == []
