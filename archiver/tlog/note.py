"""C2SP signed notes with Ed25519 keys: key names and IDs, signer and verifier key strings, sign and open.

Formats (https://c2sp.org/signed-note): a note is its text (ending in a newline), a blank line,
and signature lines ``— <name> base64(key ID || signature)``; key ID = SHA-256(name || 0x0A ||
0x01 || public key)[:4]; a verifier key is ``<name>+<hex key ID>+base64(0x01 || public key)``.
The private key file holds Go's ``golang.org/x/mod/sumdb/note`` encoding,
``PRIVATE+KEY+<name>+<hex key ID>+base64(0x01 || seed)``, so keys move between the two tools.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from archiver.errors import LogError, LogVerificationError

ED25519 = 0x01
SIGNATURE_PREFIX = "\u2014 "
PRIVATE_PREFIX = "PRIVATE+KEY+"
#: Verifiers must accept at least 16 signatures; more is refused (a note is small).
MAX_SIGNATURES = 100


def check_name(name: str) -> str:
    """A key name: non-empty, no Unicode space, no ``+``, no control character."""
    if not name or "+" in name or any(c.isspace() or ord(c) < 0x20 for c in name):
        raise LogError(f"invalid key name {name[:80]!r}: it must be non-empty, without spaces or '+'")
    return name


def key_id(name: str, public: bytes) -> int:
    """The key ID of an Ed25519 key: the first 4 bytes of SHA-256(name || 0x0A || 0x01 || key)."""
    return int.from_bytes(hashlib.sha256(name.encode() + b"\n" + bytes([ED25519]) + public).digest()[:4], "big")


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise LogError(f"{what} is not valid base64") from exc


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


@dataclass(frozen=True, slots=True)
class Verifier:
    """A public key that checks signatures of one name and key ID."""

    name: str
    key_id: int
    public: bytes

    @classmethod
    def parse(cls, vkey: str) -> Verifier:
        """A verifier key string ``name+hex8+base64(0x01||key)``; ``LogError`` when malformed."""
        parts = vkey.strip().split("+", 2)
        if len(parts) != 3 or len(parts[1]) != 8:
            raise LogError("a verifier key reads name+<8 hex digits>+<base64 key>")
        name, hex_id, b64 = parts
        check_name(name)
        try:
            kid = int(hex_id, 16)
        except ValueError as exc:
            raise LogError("the verifier key's ID is not hexadecimal") from exc
        raw = _b64decode(b64, "the verifier key")
        if len(raw) != 33 or raw[0] != ED25519:
            raise LogError("the verifier key is not an Ed25519 key (type 0x01, 32 bytes)")
        if key_id(name, raw[1:]) != kid:
            raise LogError(f"the verifier key's ID {hex_id} does not match its name and key")
        return cls(name, kid, raw[1:])

    def encode(self) -> str:
        return f"{self.name}+{self.key_id:08x}+{base64.b64encode(bytes([ED25519]) + self.public).decode()}"

    def verify(self, text: bytes, signature: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.public).verify(signature, text)
        except InvalidSignature:
            return False
        return True


class Signer:
    """An Ed25519 private key with its name: signs note texts."""

    def __init__(self, name: str, seed: bytes) -> None:
        if len(seed) != 32:
            raise LogError("an Ed25519 private key is a 32-byte seed")
        self.name = check_name(name)
        self._key = Ed25519PrivateKey.from_private_bytes(seed)
        self._seed = seed
        public = _raw_public(self._key.public_key())
        self.verifier = Verifier(name, key_id(name, public), public)

    @classmethod
    def generate(cls, name: str) -> Signer:
        seed = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        return cls(name, seed)

    @classmethod
    def parse(cls, skey: str) -> Signer:
        """A private key string ``PRIVATE+KEY+name+hex8+base64(0x01||seed)``; ``LogError`` when malformed
        (the message never shows the key)."""
        text = skey.strip()
        if not text.startswith(PRIVATE_PREFIX):
            raise LogError("a signing key file starts with PRIVATE+KEY+")
        parts = text[len(PRIVATE_PREFIX) :].split("+", 2)
        if len(parts) != 3 or len(parts[1]) != 8:
            raise LogError("a signing key reads PRIVATE+KEY+name+<8 hex digits>+<base64 key>")
        name, hex_id, b64 = parts
        raw = _b64decode(b64, "the signing key")
        if len(raw) != 33 or raw[0] != ED25519:
            raise LogError("the signing key is not an Ed25519 key (type 0x01, 32 bytes)")
        signer = cls(name, raw[1:])
        if f"{signer.verifier.key_id:08x}" != hex_id.lower():
            raise LogError("the signing key's ID does not match its name and key")
        return signer

    def encode(self) -> str:
        """The private key string (what ``archiver keygen`` writes, mode 0600)."""
        raw = base64.b64encode(bytes([ED25519]) + self._seed).decode()
        return f"{PRIVATE_PREFIX}{self.name}+{self.verifier.key_id:08x}+{raw}"

    def sign(self, text: bytes) -> bytes:
        return self._key.sign(text)


def check_text(text: str) -> bytes:
    """A note text: UTF-8, ends in a newline, no control character but newline."""
    if not text.endswith("\n"):
        raise LogError("a note text must end with a newline")
    if any(ord(c) < 0x20 and c != "\n" for c in text):
        raise LogError("a note text must not contain control characters")
    return text.encode("utf-8")


def signature_line(name: str, kid: int, signature: bytes) -> str:
    return f"{SIGNATURE_PREFIX}{name} {base64.b64encode(kid.to_bytes(4, 'big') + signature).decode()}\n"


def sign(text: str, signers: Iterable[Signer], *, keep: Sequence[str] = ()) -> bytes:
    """The signed note: ``text``, a blank line, the signature lines ``keep`` (already made) then ours."""
    body = check_text(text)
    lines = list(keep) + [signature_line(s.name, s.verifier.key_id, s.sign(body)) for s in signers]
    if not lines:
        raise LogError("a signed note needs at least one signature")
    return body + b"\n" + "".join(lines).encode()


@dataclass(frozen=True, slots=True)
class Signature:
    name: str
    key_id: int
    signature: bytes
    line: str


@dataclass(frozen=True, slots=True)
class Note:
    """A parsed note: its text, every signature line, and the names of the known keys that verified it."""

    text: str
    signatures: tuple[Signature, ...]
    verified_by: tuple[str, ...]


def parse(msg: bytes) -> tuple[str, tuple[Signature, ...]]:
    """Split a signed note into its text and signatures (not verified); ``LogError`` when malformed."""
    try:
        decoded = msg.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LogError("a signed note is not UTF-8") from exc
    if any(ord(c) < 0x20 and c != "\n" for c in decoded):
        raise LogError("a signed note contains a control character")
    split = decoded.rfind("\n\n")
    if split < 0 or not decoded.endswith("\n"):
        raise LogError("a signed note needs its text, a blank line and signature lines")
    text, block = decoded[: split + 1], decoded[split + 2 :]
    signatures: list[Signature] = []
    for line in block[:-1].split("\n"):
        if not line.startswith(SIGNATURE_PREFIX):
            raise LogError("a signed note's signature line must start with an em dash and a space")
        fields = line[len(SIGNATURE_PREFIX) :].split(" ")
        if len(fields) != 2:
            raise LogError("a signature line reads '— <key name> <base64 signature>'")
        name, b64 = fields
        check_name(name)
        raw = _b64decode(b64, "a note signature")
        if len(raw) < 5:
            raise LogError("a note signature is too short")
        signatures.append(Signature(name, int.from_bytes(raw[:4], "big"), raw[4:], line + "\n"))
        if len(signatures) > MAX_SIGNATURES:
            raise LogError(f"a signed note has more than {MAX_SIGNATURES} signatures")
    return text, tuple(signatures)


def open_note(msg: bytes, verifiers: Sequence[Verifier]) -> Note:
    """Parse and verify a signed note: every signature of a known key must verify, at least one must
    exist; unknown keys are ignored. ``LogVerificationError`` otherwise."""
    text, signatures = parse(msg)
    body = text.encode()
    known = {(v.name, v.key_id): v for v in verifiers}
    verified: list[str] = []
    for sig in signatures:
        verifier = known.get((sig.name, sig.key_id))
        if verifier is None:
            continue
        if not verifier.verify(body, sig.signature):
            raise LogVerificationError(f"the signature of {sig.name} ({sig.key_id:08x}) does not verify")
        verified.append(sig.name)
    if not verified:
        raise LogVerificationError("no signature by a known key: the note is not signed by the expected log")
    return Note(text, signatures, tuple(verified))
