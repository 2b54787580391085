"""Standalone, offline verifier of an archiver proof bundle: Python standard library plus ``cryptography`` only.

Copy this one file anywhere and run ``python verify_bundle.py BUNDLE --key PUBKEY [FILES...]``:
it checks the signed checkpoint with the log's public key (C2SP signed-note, Ed25519), the
archive's leaf against the checkpoint's root (RFC 6962 inclusion proof), the manifest against the
leaf (SHA-256), and each downloaded FILE against the manifest (SHA-256 and size). It imports
nothing from the archiver (its own test runs it with ``python -I`` and only ``cryptography`` on
the path), so a tournament organiser or a lawyer needs neither the archiver nor the bucket.

Exit status 0: everything verified; 1: something did not (what, on stderr); 2: bad usage or an
unreadable file. ``archiver verify-bundle`` runs the same code.

Bundle (JSON, ``"format": "archiver-proof-bundle/1"``): ``manifest`` and ``leaf`` (base64 of their
exact bytes), ``leaf_index``, ``inclusion_proof`` (base64 hashes, bottom-up), ``checkpoint`` (the
signed checkpoint note), ``logged_at`` (informational), ``timestamp`` (an RFC 3161 token of the
checkpoint, base64, or null). This tool only checks that a timestamp names the checkpoint's SHA-256
and says so: it does not verify the TSA's signature (the standard library has no CMS), and its
report says that in plain words; ``archiver verify-bundle --tsa-cert ROOT.pem`` verifies it.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

FORMAT = "archiver-proof-bundle/1"
_DASH = "\u2014 "


class BundleError(Exception):
    """The bundle does not verify; the message says what was found."""


@dataclass(frozen=True)
class Verified:
    """What a bundle proved."""

    origin: str
    tree_size: int
    leaf_index: int
    session: str
    instance: str | None
    archived_at: str
    manifest_sha256: str
    files: tuple[tuple[str, str], ...]  # (file name, the manifest item it matched)
    #: The bundle carries an RFC 3161 timestamp naming the checkpoint (its signature is not checked here).
    timestamped: bool = False

    def report(self, *, timestamp_line: bool = True) -> str:
        """What was proved; ``timestamp_line``: also what this tool did (not) check of the timestamp."""
        lines = [
            f"OK: session {self.session!r} instance {self.instance or 'legacy'} (archived {self.archived_at})",
            f"  is leaf {self.leaf_index} of log {self.origin}, whose signed checkpoint has {self.tree_size} leaves",
            f"  manifest sha256 {self.manifest_sha256}",
        ]
        lines += [f"  file {name}: matches {item}" for name, item in self.files]
        if timestamp_line:
            lines.append(
                "  timestamp: present (an RFC 3161 token naming this checkpoint), NOT verified by this tool: "
                "run `archiver verify-bundle --tsa-cert ROOT.pem` to check the TSA's signature and time"
                if self.timestamped
                else "  timestamp: none (the bundle proves order in the log, not a time vouched for by a TSA)"
            )
        return "\n".join(lines)


def _b64(value: object, what: str) -> bytes:
    if not isinstance(value, str):
        raise BundleError(f"{what} is missing from the bundle")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise BundleError(f"{what} is not valid base64") from None


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def root_from_inclusion(index: int, size: int, leaf_hash: bytes, proof: Sequence[bytes]) -> bytes:
    """RFC 9162 §2.1.3.2: the root an inclusion proof leads to."""
    if not 0 <= index < size:
        raise BundleError(f"leaf index {index} is outside a tree of {size} leaves")
    if any(len(p) != 32 for p in proof):
        raise BundleError("an inclusion proof hash is not 32 bytes")
    fn, sn, r = index, size - 1, leaf_hash
    for p in proof:
        if sn == 0:
            raise BundleError("the inclusion proof is too long")
        if fn & 1 or fn == sn:
            r = _node(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = _node(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise BundleError("the inclusion proof is too short")
    return r


def parse_vkey(vkey: str) -> tuple[str, bytes, bytes]:
    """``name+hex8+base64(0x01||key)`` → (name, key ID, public key)."""
    parts = vkey.strip().split("+", 2)
    if len(parts) != 3 or len(parts[1]) != 8:
        raise BundleError("the public key does not read name+<8 hex digits>+<base64 key>")
    name, hex_id, b64 = parts
    raw = _b64(b64, "the public key")
    if len(raw) != 33 or raw[0] != 1:
        raise BundleError("the public key is not an Ed25519 key")
    key_id = hashlib.sha256(name.encode() + b"\n" + raw).digest()[:4]
    if key_id.hex() != hex_id.lower():
        raise BundleError("the public key's ID does not match its name and key")
    return name, key_id, raw[1:]


def open_checkpoint(note: str, vkey: str) -> tuple[str, int, bytes]:
    """Verify a signed checkpoint with the log's key: (origin, tree size, root hash)."""
    name, key_id, public = parse_vkey(vkey)
    split = note.rfind("\n\n")
    if split < 0 or not note.endswith("\n"):
        raise BundleError("the checkpoint is not a signed note")
    text, signatures = note[: split + 1], note[split + 2 : -1].split("\n")
    verified = False
    for line in signatures:
        fields = line[len(_DASH) :].split(" ") if line.startswith(_DASH) else []
        if len(fields) != 2:
            raise BundleError("a checkpoint signature line is malformed")
        raw = _b64(fields[1], "a checkpoint signature")
        if fields[0] != name or raw[:4] != key_id:
            continue  # another key's signature (a witness): not ours to check
        try:
            Ed25519PublicKey.from_public_bytes(public).verify(raw[4:], text.encode())
        except InvalidSignature:
            raise BundleError(f"the checkpoint's signature by {name} does not verify: it was altered") from None
        verified = True
    if not verified:
        raise BundleError(f"the checkpoint is not signed by the key {name} (another key signed it)")
    lines = text[:-1].split("\n")
    if len(lines) < 3 or not lines[1].isdigit():
        raise BundleError("the checkpoint text is not origin, tree size, root hash")
    origin = lines[0]
    if origin != name and not origin.startswith(name + "/"):
        raise BundleError(f"the checkpoint's log {origin!r} is not a log of the key {name!r}")
    root = _b64(lines[2], "the checkpoint's root hash")
    if len(root) != 32:
        raise BundleError("the checkpoint's root hash is not 32 bytes")
    return origin, int(lines[1]), root


def _file_digest(path: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def verify(bundle_bytes: bytes, vkey: str, files: Sequence[Path] = ()) -> Verified:
    """Verify a bundle (and files against its manifest); ``BundleError`` names the first failure."""
    try:
        bundle = json.loads(bundle_bytes)
    except (ValueError, UnicodeDecodeError):
        raise BundleError("the bundle is not JSON") from None
    if not isinstance(bundle, dict) or bundle.get("format") != FORMAT:
        raise BundleError(f"not a proof bundle of format {FORMAT}")
    note = bundle.get("checkpoint")
    if not isinstance(note, str):
        raise BundleError("the bundle has no checkpoint")
    origin, size, root = open_checkpoint(note, vkey)
    leaf = _b64(bundle.get("leaf"), "the leaf")
    index = bundle.get("leaf_index")
    proof_field = bundle.get("inclusion_proof")
    if not isinstance(index, int) or not isinstance(proof_field, list):
        raise BundleError("the bundle has no leaf index or inclusion proof")
    proof = [_b64(p, "an inclusion proof hash") for p in proof_field]
    if root_from_inclusion(index, size, hashlib.sha256(b"\x00" + leaf).digest(), proof) != root:
        raise BundleError("the leaf is not in the log: its inclusion proof does not lead to the checkpoint's root")
    try:
        fields = json.loads(leaf)
        sha, session, instance, when = (
            fields["manifest_sha256"], fields["session"], fields["instance"], fields["archived_at"]
        )  # fmt: skip
    except (ValueError, UnicodeDecodeError, KeyError, TypeError):
        raise BundleError("the leaf is not an archiver leaf") from None
    manifest_bytes = _b64(bundle.get("manifest"), "the manifest")
    if hashlib.sha256(manifest_bytes).hexdigest() != sha:
        raise BundleError("the manifest is not the one the log holds: its SHA-256 differs from the leaf's")
    try:
        manifest = json.loads(manifest_bytes)
    except (ValueError, UnicodeDecodeError):
        raise BundleError("the manifest is not JSON") from None
    if manifest.get("session_id") != session or manifest.get("instance") != instance:
        raise BundleError("the manifest names another session or instance than the leaf")
    matched = []
    items = [i for i in manifest.get("items", []) if isinstance(i, dict) and i.get("sha256")]
    for path in files:
        try:
            digest, length = _file_digest(path)
        except OSError as exc:
            raise BundleError(f"cannot read {path}: {exc.strerror}") from None
        if digest == sha and length == len(manifest_bytes):
            # The manifest itself (`archiver get` writes it beside the files): the one the log holds.
            matched.append((path.name, "the manifest the log holds"))
            continue
        item = next((i for i in items if i.get("sha256") == digest and i.get("size") == length), None)
        if item is None:
            raise BundleError(f"file {path.name}: its SHA-256 {digest[:16]}… is not in the manifest (altered?)")
        matched.append((path.name, str(item.get("key") or item.get("path") or item.get("kind"))))
    stamp = bundle.get("timestamp")
    # Without a CMS parser, at least the token must carry the checkpoint's SHA-256 (its message
    # imprint, in the clear inside the DER): a timestamp of other bytes is not this checkpoint's.
    if stamp is not None and hashlib.sha256(note.encode()).digest() not in _b64(stamp, "the timestamp"):
        raise BundleError("the timestamp is of other bytes than this checkpoint (it does not name its SHA-256)")
    return Verified(origin, size, index, session, instance, when, sha, tuple(matched), stamp is not None)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verify_bundle.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path, help="the proof bundle (archiver prove -o)")
    parser.add_argument("--key", required=True, help="the log's public key (name+id+key) or a file holding it")
    parser.add_argument("files", nargs="*", type=Path, help="downloaded logs or artifacts to check")
    args = parser.parse_intermixed_args(argv)
    key = args.key
    try:
        if "+" not in key or Path(key).is_file():
            key = Path(key).read_text(encoding="utf-8").strip()
        data = args.bundle.read_bytes()
    except OSError as exc:
        print(f"error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        result = verify(data, key, args.files)
    except BundleError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    print(result.report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
