"""A user mistake reaches the terminal as one line and a non-zero exit, never as a traceback."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from archiver import errors
from archiver.archive.state import StateDB
from archiver.cli.base import main

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


# --- every user mistake: one line, a non-zero exit, in-process and as the real entry point ---------


def _corrupt_db(state_dir: Path) -> None:
    (state_dir / "store").mkdir(parents=True)
    (state_dir / "state.db").write_bytes(b"this is not an SQLite file\n" * 200)


def _damaged_db(state_dir: Path) -> None:
    """A state DB whose first page (header, schema version) is intact and every other page garbage:
    the damage shows only when a query reads a table."""
    (state_dir / "store").mkdir(parents=True)
    StateDB.open(state_dir).close()
    data = bytearray((state_dir / "state.db").read_bytes())
    data[4096:] = b"Z" * (len(data) - 4096)
    (state_dir / "state.db").write_bytes(bytes(data))


def _newer_db(state_dir: Path) -> None:
    (state_dir / "store").mkdir(parents=True)
    with contextlib.closing(sqlite3.connect(state_dir / "state.db")) as conn:
        conn.execute("CREATE TABLE future (x)")
        conn.execute("PRAGMA user_version=99")
        conn.commit()


def _not_utf8_config(state_dir: Path) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "bad.toml").write_bytes(b'store = "file:///tmp/\xff\xfe"\n')


def _not_utf8_token(state_dir: Path) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "token").write_bytes(b"\xfft0ken-value")


#: Backfill needs a token, an API URL and a store before it opens the state DB (read-write).
_BACKFILL = ["archive", "--api-url", "http://127.0.0.1:9", "--store", "file:///{d}/store", "--state-dir", "{d}", "x"]

# (name, argv with {d} = the state dir, set-up, exit code, what the one line must say)
MISTAKES = [
    ("corrupt DB, status", ["status", "--state-dir", "{d}"], _corrupt_db, 1, "move it aside"),
    ("corrupt DB, backfill", _BACKFILL, _corrupt_db, 1, "move it aside"),
    ("damaged DB, status", ["status", "--state-dir", "{d}"], _damaged_db, 1, "move it aside"),
    ("damaged DB, backfill", _BACKFILL, _damaged_db, 1, "move it aside"),
    ("newer DB, status", ["status", "--state-dir", "{d}"], _newer_db, 1, "run the newer archiver"),
    ("newer DB, backfill", _BACKFILL, _newer_db, 1, "run the newer archiver"),
    ("config not UTF-8", ["check", "--config", "{d}/bad.toml"], _not_utf8_config, 2, "is not UTF-8"),
    ("token not UTF-8", ["check", "--api-token-file", "{d}/token"], _not_utf8_token, 2, "token file is not UTF-8"),
    ("absurd duration", ["check", "--retention", "99999999999999999999h"], None, 2, "duration too long"),
    ("huge duration", ["check", "--prune-after", "9" * 400 + "h"], None, 2, "duration too long"),
    ("absurd float duration", ["check", "--poll-interval", "1e308"], None, 2, "duration too long"),
    ("absurd workers", ["check", "--fetch-workers", "99999999999999999999"], None, 2, "integer out of range"),
    ("too many workers", ["check", "--upload-workers", "100000"], None, 2, "between 1 and 256"),
    ("no workers", ["check", "--fetch-workers", "0"], None, 2, "between 1 and 256"),
    ("absurd size", ["check", "--max-artifact-size", "9" * 400 + "TB"], None, 2, "size too large"),
    ("absurd count", ["check", "--max-sessions", "99999999999999999999"], None, 2, "integer out of range"),
    ("fake time scale NaN", ["fake-service", "--time-scale", "nan"], None, 2, "expected a finite number"),
    ("fake retention", ["fake-service", "--retention", "99999999999999999999h"], None, 2, "duration too long"),
    ("no verify processes", ["verify", "--store", "file://{d}", "--processes", "0"], None, 2, "at least 1) or auto"),
    (
        "retention under margin",
        ["check", "--retention", "5m", "--deadline-margin", "10m"],
        None,
        2,
        "must be longer than --deadline-margin",
    ),
]


def _argv(argv: list[str], state_dir: Path) -> list[str]:
    return [arg.replace("{d}", str(state_dir)) for arg in argv]


@pytest.mark.parametrize(("argv", "setup", "code", "says"), [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_a_user_mistake_is_one_error_line_and_a_non_zero_exit_in_process(
    tmp_path: Path, argv: list[str], setup: Callable[[Path], None] | None, code: int, says: str
) -> None:
    """Through click's standalone mode, as the `archiver` entry point runs: SystemExit, never a traceback."""
    if setup:
        setup(tmp_path)
    env = {"ARCHIVER_API_TOKEN": "t0ken-value", "ARCHIVER_STATE_DIR": str(tmp_path / "default-state")}
    result = CliRunner().invoke(main, _argv(argv, tmp_path), env=env, standalone_mode=True)
    assert isinstance(result.exception, SystemExit), result.exc_info
    assert result.exit_code == code
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert says in lines[0]
    assert "t0ken-value" not in result.output


AS_PROCESS = ["corrupt DB, backfill", "newer DB, status", "config not UTF-8", "absurd duration"]


@pytest.mark.parametrize(
    ("argv", "setup", "code", "says"),
    [m[1:] for m in MISTAKES if m[0] in AS_PROCESS],
    ids=[m[0] for m in MISTAKES if m[0] in AS_PROCESS],
)
def test_a_user_mistake_is_one_error_line_and_a_non_zero_exit_as_a_process(
    tmp_path: Path, argv: list[str], setup: Callable[[Path], None] | None, code: int, says: str
) -> None:
    if setup:
        setup(tmp_path)
    env = {**_clean_env(), "ARCHIVER_API_TOKEN": "t0ken-value", "ARCHIVER_STATE_DIR": str(tmp_path / "s")}
    result = subprocess.run([ARCHIVER, *_argv(argv, tmp_path)], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == code
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], result.stderr


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ARCHIVER_")}


def test_an_unknown_crash_point_is_one_error_line_not_an_import_traceback(tmp_path: Path) -> None:
    env = {**_clean_env(), "ARCHIVER_CRASH_AT": "after_lunch", "ARCHIVER_API_TOKEN": "t0ken-value"}
    result = subprocess.run(
        [ARCHIVER, *_argv(_BACKFILL, tmp_path)], capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "ARCHIVER_CRASH_AT='after_lunch': unknown crash point; known: after_spool_write" in lines[0]
    assert not (tmp_path / "state.db").exists()  # refused before anything was opened


#: Exception classes outside the tree on purpose: internal control flow of the fake service,
#: documented as such in the docstring of archiver/errors.py.
INTERNAL_CONTROL_FLOW = {
    "archiver.fake.errors.HttpProblem",
    "archiver.fake.validation.InvalidBody",
    "archiver.retrieval.grep._Cancelled",
    "archiver.upstream.listparser.WholeBodyNeeded",
    "archiver.tlog.standalone.BundleError",
}


def test_every_exception_class_of_the_package_is_under_the_root_or_documented_internal() -> None:
    import importlib
    import pkgutil

    import archiver

    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(archiver.__path__, "archiver."):
        if info.name.endswith("__main__"):
            continue  # runs the CLI on import
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == info.name:
                found[f"{info.name}.{value.__qualname__}"] = value
    assert len(found) > 30 and "archiver.store.s3_multipart.NoSuchUploadError" in found  # the whole package
    outside = {name for name, cls in found.items() if not issubclass(cls, errors.ArchiverError)}
    assert outside == INTERNAL_CONTROL_FLOW
    doc = errors.__doc__ or ""
    assert [name for name, cls in found.items() if cls.__name__ not in doc] == []


@pytest.mark.parametrize("setup", [_damaged_db, _newer_db], ids=["damaged DB", "newer DB"])
def test_the_daemon_refuses_an_unusable_state_db_with_one_line(tmp_path: Path, setup: Callable[[Path], None]) -> None:
    """`archiver run` as a process (its logging and signal handlers are process-wide): one line, exit 1,
    nothing left running."""
    setup(tmp_path)
    argv = _argv(["run", *_BACKFILL[1:-1], "--web.listen-address", "127.0.0.1:0"], tmp_path)
    env = {**_clean_env(), "ARCHIVER_API_TOKEN": "t0ken-value"}
    result = subprocess.run([ARCHIVER, *argv], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: state DB {tmp_path / 'state.db'} "), result.stderr
    assert "t0ken-value" not in result.stderr
