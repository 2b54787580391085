"""Log lines never carry a known secret, wherever it hides in the record."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest

from archiver import logs as logsetup

SECRET = 'tok"en-hunter2'


@pytest.mark.parametrize("fmt", ["text", "json"])
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
    from archiver.credentials import Token

    path = tmp_path / "token"
    path.write_text("first-t0ken-value")
    token = Token.from_file(path)
    out = io.StringIO()
    logsetup.configure("text", "info", secrets=token.known_values, stream=out)
    log = logging.getLogger("archiver.test")
    try:
        path.write_text("second-t0ken-value")  # another size: seen even within one mtime tick
        assert token.reveal() == "second-t0ken-value"
        log.info("upstream echoed %s and %s", "first-t0ken-value", "second-t0ken-value")
    finally:
        for handler in [h for h in logging.getLogger().handlers if h.get_name() == "archiver"]:
            logging.getLogger().removeHandler(handler)
    assert "upstream echoed *** and ***" in out.getvalue()
