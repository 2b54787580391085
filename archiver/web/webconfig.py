"""The `--web-config-file` (exporter-toolkit schema): TLS and basic auth of the daemon's HTTP server."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import re
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import bcrypt
import yaml

from archiver.errors import ConfigError

log = logging.getLogger("archiver.webconfig")

_TOP_KEYS = frozenset({"tls_server_config", "basic_auth_users", "http_server_config"})
_TLS_KEYS = frozenset({"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version"})
#: exporter-toolkit keys we recognise but cannot honour with Python's ssl module: refusing them is safer
#: than silently serving a weaker (or different) TLS setup than the file asks for.
_TLS_UNSUPPORTED = frozenset(
    {
        "cert",
        "key",
        "client_ca",
        "cipher_suites",
        "curve_preferences",
        "client_allowed_sans",
        "prefer_server_cipher_suites",
    }
)
_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
#: exporter-toolkit client_auth_type → Python verify mode. The two "accept any certificate" modes of
#: Go have no equivalent (Python always verifies a presented client certificate): refused in parsing.
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_CLIENT_AUTH_UNSUPPORTED = frozenset({"RequestClientCert", "RequireAnyClientCert"})
_BCRYPT_HASH = re.compile(r"^\$2[aby]\$\d{2}\$[./A-Za-z0-9]{53}$")
#: Compared against when the user is unknown, so an unknown user costs the same bcrypt time as a
#: wrong password and response times do not reveal which user names exist (cost 10, like real hashes).
_DUMMY_HASH = b"$2b$10$HfTmQP/bsIMFaSWgRQbRpu4KEIPvJTtp/G3Jkt4WEfCwTsEhYOzGe"
#: Successful checks remembered; more than this (many distinct passwords) just starts over.
_AUTH_CACHE_LIMIT = 256


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """`tls_server_config`, with file paths resolved against the config file's directory."""

    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"
    max_version: str | None = None


@dataclass(frozen=True, slots=True)
class WebConfig:
    """The parsed web config file; `None` parts are off."""

    tls: TLSConfig | None = None
    #: user name → bcrypt hash (read-only view).
    basic_auth_users: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def ssl_context(self) -> ssl.SSLContext | None:
        """A server-side SSLContext for the TLS part, loading the files now; errors are ConfigError."""
        return build_ssl_context(self.tls) if self.tls is not None else None


def load_web_config(path: str | Path) -> WebConfig:
    """Read and validate a web config file (relative paths inside are relative to the file's directory)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"web config file {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"web config file {str(path)!r} is not UTF-8") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"web config file {str(path)!r} is not valid YAML: {exc}") from None
    config = parse_web_config(data, base_dir=path.parent, source=str(path))
    # Load the certificate and key now: a bad file must stop start-up, not the first scrape.
    config.ssl_context()
    return config


def parse_web_config(data: Any, *, base_dir: Path, source: str = "web config") -> WebConfig:
    """Validate the decoded YAML; every unknown or unsupported key is a ConfigError naming it."""
    if data is None:
        return WebConfig()  # an empty file: no TLS, no auth (exporter-toolkit accepts it too)
    top = _mapping(data, source)
    for key in top:
        if key not in _TOP_KEYS:
            raise ConfigError(f"{source}: unknown key {key!r} (known: {', '.join(sorted(_TOP_KEYS))})")
    if top.get("http_server_config") is not None:
        log.warning("%s: http_server_config is not supported and is ignored", source)
    tls = _parse_tls(top.get("tls_server_config"), base_dir, source)
    users = _parse_users(top.get("basic_auth_users"), source)
    return WebConfig(tls=tls, basic_auth_users=MappingProxyType(users))


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{what} must be a mapping, got {type(value).__name__}")
    for key in value:
        if not isinstance(key, str):
            raise ConfigError(f"{what}: key {key!r} is not a string")
    return value


def _parse_tls(raw: Any, base_dir: Path, source: str) -> TLSConfig | None:
    if raw is None:
        return None
    what = f"{source}: tls_server_config"
    tls = _mapping(raw, what)
    for key in tls:
        if key in _TLS_UNSUPPORTED:
            raise ConfigError(f"{what}.{key} is not supported by session-archiver")
        if key not in _TLS_KEYS:
            raise ConfigError(f"{what}: unknown key {key!r} (known: {', '.join(sorted(_TLS_KEYS))})")

    def path(key: str, required: bool) -> Path | None:
        value = tls.get(key)
        if value is None or value == "":
            if required:
                raise ConfigError(f"{what}.{key} is required")
            return None
        if not isinstance(value, str):
            raise ConfigError(f"{what}.{key} must be a file path")
        return base_dir / value  # an absolute value replaces base_dir

    def choice(key: str, allowed: Mapping[str, Any] | frozenset[str], default: str | None) -> str | None:
        value = tls.get(key, default)
        if value is None:
            return None
        if not isinstance(value, str) or value not in allowed:
            raise ConfigError(f"{what}.{key} is {value!r}; expected one of {', '.join(sorted(allowed))}")
        return value

    client_auth = tls.get("client_auth_type", "NoClientCert")
    if client_auth in _CLIENT_AUTH_UNSUPPORTED:
        raise ConfigError(
            f"{what}.client_auth_type {client_auth} is not supported (Python verifies every client "
            "certificate it asks for): use VerifyClientCertIfGiven or RequireAndVerifyClientCert"
        )
    client_auth = choice("client_auth_type", _CLIENT_AUTH, "NoClientCert")
    assert client_auth is not None
    client_ca = path("client_ca_file", required=False)
    if client_auth != "NoClientCert" and client_ca is None:
        raise ConfigError(f"{what}.client_ca_file is required with client_auth_type {client_auth}")
    cert_file, key_file = path("cert_file", required=True), path("key_file", required=True)
    assert cert_file is not None and key_file is not None
    min_version = choice("min_version", _TLS_VERSIONS, "TLS12")
    assert min_version is not None
    return TLSConfig(
        cert_file=cert_file,
        key_file=key_file,
        client_auth_type=client_auth,
        client_ca_file=client_ca,
        min_version=min_version,
        max_version=choice("max_version", _TLS_VERSIONS, None),
    )


def _parse_users(raw: Any, source: str) -> dict[str, str]:
    if raw is None:
        return {}
    what = f"{source}: basic_auth_users"
    users = _mapping(raw, what)
    result: dict[str, str] = {}
    for user, hashed in users.items():
        # Never echo the value: it is a password hash.
        if not isinstance(hashed, str) or not _BCRYPT_HASH.match(hashed):
            raise ConfigError(f"{what}: the password of user {user!r} is not a bcrypt hash")
        result[user] = hashed
    return result


def build_ssl_context(tls: TLSConfig) -> ssl.SSLContext:
    """A server SSLContext for `tls`; unreadable or mismatched files are a ConfigError."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _TLS_VERSIONS[tls.min_version]
    if tls.max_version is not None:
        context.maximum_version = _TLS_VERSIONS[tls.max_version]
    try:
        context.load_cert_chain(certfile=str(tls.cert_file), keyfile=str(tls.key_file))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"TLS certificate {str(tls.cert_file)!r} / key {str(tls.key_file)!r}: {exc}") from None
    context.verify_mode = _CLIENT_AUTH[tls.client_auth_type]
    if tls.client_ca_file is not None:
        try:
            context.load_verify_locations(cafile=str(tls.client_ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"TLS client CA file {str(tls.client_ca_file)!r}: {exc}") from None
    return context


class BasicAuth:
    """Checks `Authorization: Basic ...` headers against the bcrypt hashes of the web config.

    bcrypt is slow by design; Prometheus sends the same credentials every scrape, so successful
    checks are remembered (as the exporter-toolkit does), keyed by a SHA-256 over the user, the
    stored hash and the presented password: the cache never holds a password, and a changed hash can
    never match an old entry. Failures are never cached, so guessing stays expensive.
    """

    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = [(user.encode("utf-8"), hashed.encode("ascii")) for user, hashed in users.items()]
        self._ok: set[bytes] = set()
        self._lock = threading.Lock()

    def check(self, authorization: str | None) -> bool:
        """Whether the header carries a known user with the right password."""
        if not authorization:
            return False
        scheme, _, encoded = authorization.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        user, sep, password = decoded.partition(b":")
        if not sep:
            return False
        # Look at every user with a constant-time comparison, so timing does not reveal a prefix match
        # or the position of the user in the file.
        stored: bytes | None = None
        for name, hashed in self._users:
            if hmac.compare_digest(name, user):
                stored = hashed
        cache_key = hashlib.sha256(b"\0".join((user, stored or _DUMMY_HASH, password))).digest()
        if stored is not None and cache_key in self._ok:
            return True
        try:
            matched = bcrypt.checkpw(password, stored or _DUMMY_HASH)
        except ValueError:  # a NUL byte or an over-long password: not a match
            matched = False
        if stored is None or not matched:
            return False
        with self._lock:
            if len(self._ok) >= _AUTH_CACHE_LIMIT:
                self._ok.clear()
            self._ok.add(cache_key)
        return True
