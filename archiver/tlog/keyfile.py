"""The log's key files: the private signing key (mode 0600) and the public verifier key, read and written."""

from __future__ import annotations

import os
from pathlib import Path

from archiver.errors import ConfigError, LogError
from archiver.tlog.note import Signer, Verifier


def load_signer(path: Path) -> Signer:
    """The signing key in ``path``; ``ConfigError`` (never showing the key) when unreadable or malformed."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the log key file {path}: {getattr(exc, 'strerror', exc)}") from None
    try:
        return Signer.parse(text)
    except LogError as exc:
        raise ConfigError(f"transparency log key file {path}: {exc}") from None


def load_verifier(value: str) -> Verifier:
    """A verifier key given as the key string itself or as a file holding it."""
    text = value.strip()
    if "+" not in text or os.path.exists(text):
        try:
            text = Path(text).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError, ValueError) as exc:  # ValueError: a NUL in the name
            raise ConfigError(f"cannot read the verifier key file {value!r}: {getattr(exc, 'strerror', exc)}") from None
    try:
        return Verifier.parse(text)
    except LogError as exc:
        raise ConfigError(f"verifier key {value!r}: {exc}") from None


def write_keypair(name: str, private_path: Path, public_path: Path) -> Signer:
    """Generate a key named ``name``; the private key file is created with mode 0600 and never replaced."""
    try:
        signer = Signer.generate(name)
    except LogError as exc:
        raise ConfigError(str(exc)) from None
    try:
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise ConfigError(f"{private_path} exists: keygen never replaces a key") from None
    except OSError as exc:
        raise ConfigError(f"cannot create {private_path}: {exc.strerror}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(signer.encode() + "\n")
        out.flush()
        os.fsync(out.fileno())
    try:
        public_path.write_text(signer.verifier.encode() + "\n", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write {public_path}: {exc.strerror}") from None
    return signer
