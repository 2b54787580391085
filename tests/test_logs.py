"""Log lines never carry a known secret, wherever it hides in the record."""

from __future__ import annotations

import io
import json
import logging

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
