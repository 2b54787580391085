"""Log lines never carry a known secret, wherever it hides in the record."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from archiver.app import logs as logsetup

SECRET = 'tok"en-hunter2'


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_secrets_are_redacted_from_messages_fields_and_tracebacks(fmt: str) -> None:
    out = io.StringIO()
    logsetup.configure(fmt, "info", secrets=[SECRET], stream=out)
    log = logging.getLogger("archiver.test")
    try:
        log.info("message with %s", SECRET, extra={"detail": f"field {SECRET}"})
        try:
            raise RuntimeError(f"upstream echoed {SECRET}")
        except RuntimeError:
            log.exception("failure")
    finally:
        for handler in [h for h in logging.getLogger().handlers if h.get_name() == "archiver"]:
            logging.getLogger().removeHandler(handler)
    text = out.getvalue()
    assert "hunter2" not in text
    assert text.count("***") >= 3
    if fmt == "json":
        assert all(json.loads(line)["level"] for line in text.splitlines() if line.startswith("{"))


def test_a_rotated_token_is_redacted_as_well_as_every_earlier_value(tmp_path: Path) -> None:
    from archiver.config.credentials import Token

    path = tmp_path / "token"
    path.write_text("first-t0ken-value")
    token = Token.from_file(path)
    out = io.StringIO()
    logsetup.configure("logfmt", "info", secrets=token.known_values, stream=out)
    log = logging.getLogger("archiver.test")
    try:
        path.write_text("second-t0ken-value")  # another size: seen even within one mtime tick
        assert token.reveal() == "second-t0ken-value"
        log.info("upstream echoed %s and %s", "first-t0ken-value", "second-t0ken-value")
    finally:
        for handler in [h for h in logging.getLogger().handlers if h.get_name() == "archiver"]:
            logging.getLogger().removeHandler(handler)
    assert "upstream echoed *** and ***" in out.getvalue()


def _logged(fmt: str, level: str, emit: Callable[[logging.Logger], None]) -> str:
    out = io.StringIO()
    logsetup.configure(fmt, level, stream=out)
    try:
        emit(logging.getLogger("archiver.test"))
    finally:
        for handler in [h for h in logging.getLogger().handlers if h.get_name() == "archiver"]:
            logging.getLogger().removeHandler(handler)
    return out.getvalue()


def test_logfmt_lines_quote_what_needs_it_and_name_levels_as_promslog() -> None:
    """Bare values stay bare; spaces, quotes, '=', newlines and the empty string are quoted (JSON escapes)."""
    text = _logged(
        "logfmt",
        "warn",
        lambda log: (
            log.info("not shown at warn"),
            log.warning('disk "spool" full', extra={"path": "/var/lib/a b", "n": 3, "empty": "", "eq": "a=b"}),
            log.error("two\nlines"),
        ),
    )
    stamps, rest = zip(*(line.split(" ", 1) for line in text.splitlines()), strict=True)
    assert list(rest) == [
        'level=warn logger=archiver.test msg="disk \\"spool\\" full" path="/var/lib/a b" n=3 empty="" eq="a=b"',
        'level=error logger=archiver.test msg="two\\nlines"',
    ]
    assert all(re.fullmatch(r"ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp) for stamp in stamps)


@pytest.mark.parametrize(("fmt", "level"), [("text", "warning"), ("logfmt", "warn")])
def test_text_and_warning_the_0x_names_mean_logfmt_and_warn(fmt: str, level: str) -> None:
    text = _logged(fmt, level, lambda log: (log.info("hidden"), log.warning("shown")))
    assert text.count("\n") == 1 and " level=warn logger=archiver.test msg=shown" in text


def test_json_lines_name_the_warning_level_warn() -> None:
    text = _logged("json", "info", lambda log: log.warning("careful"))
    assert json.loads(text)["level"] == "warn"
