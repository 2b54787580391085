"""Signed notes and checkpoints match the C2SP specs' and Go sumdb/note's published examples byte for byte."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from archiver.errors import LogError, LogVerificationError
from archiver.tlog import checkpoint, note
from archiver.tlog.checkpoint import Checkpoint

C2SP = Path(__file__).resolve().parents[1] / "data" / "c2sp"

# golang.org/x/mod/sumdb/note, package documentation ("It can be constructed and displayed using").
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
GO_SIG = "x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM="
GO_NOTE = f"{GO_TEXT}\n— PeterNeumann {GO_SIG}\n".encode()


def test_signing_the_go_example_reproduces_its_note_and_keys_byte_for_byte() -> None:
    signer = note.Signer.parse(GO_SKEY)
    assert signer.encode() == GO_SKEY
    assert signer.verifier.encode() == GO_VKEY
    assert note.sign(GO_TEXT, [signer]) == GO_NOTE
    opened = note.open_note(GO_NOTE, [note.Verifier.parse(GO_VKEY)])
    assert (opened.text, opened.verified_by) == (GO_TEXT, ("PeterNeumann",))


def test_the_signed_note_spec_example_verifies_with_its_verifier_key() -> None:
    vkey = (C2SP / "signed-note-example.vkey").read_text().strip()
    msg = (C2SP / "signed-note-example.note").read_bytes()
    verifier = note.Verifier.parse(vkey)
    assert verifier.encode() == vkey
    assert (verifier.name, verifier.key_id) == ("example.com/foo", 0x530D903A)
    opened = note.open_note(msg, [verifier])
    assert opened.text == "This is an example message.\n"
    # Re-encoding what was parsed gives the published bytes back.
    sig = opened.signatures[0]
    assert opened.text.encode() + b"\n" + note.signature_line(sig.name, sig.key_id, sig.signature).encode() == msg


def test_a_note_text_with_empty_lines_is_split_at_the_last_blank_line() -> None:
    msg = (C2SP / "signed-note-quasimodo.note").read_bytes()
    text, sigs = note.parse(msg)
    assert text == "Ognuno sta solo sul cuor della terra\ntrafitto da un raggio di sole:\n\ned è subito sera.\n"
    assert [s.name for s in sigs] == ["quasimodo.example/salvatore"]
    assert text.encode() + b"\n" + sigs[0].line.encode() == msg


def test_the_checkpoint_spec_example_parses_and_re_encodes_byte_for_byte() -> None:
    msg = (C2SP / "tlog-checkpoint-example.note").read_bytes()
    text, sigs = note.parse(msg)
    cp = Checkpoint.parse(text)
    assert cp == Checkpoint(
        "example.com/behind-the-sofa", 20852163, base64.b64decode("CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=")
    )
    assert cp.text() == text
    assert cp.text().encode() + b"\n" + "".join(s.line for s in sigs).encode() == msg


def test_a_signed_checkpoint_round_trips_and_keeps_extension_lines() -> None:
    signer = note.Signer.generate("archiver.example/log/shard-0")
    cp = Checkpoint(signer.name, 3, bytes(range(32)), ("ts 2026-11-27T22:00:00Z",))
    msg = checkpoint.sign(cp, signer)
    assert checkpoint.open_signed(msg, signer.verifier) == cp
    assert msg.startswith(b"archiver.example/log/shard-0\n3\nAAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\nts ")


def test_another_key_or_a_changed_text_does_not_verify() -> None:
    signer = note.Signer.parse(GO_SKEY)
    other = note.Signer("PeterNeumann", bytes(32))
    with pytest.raises(LogVerificationError, match="no signature by a known key"):
        note.open_note(GO_NOTE, [other.verifier])  # same name, another key ID: ignored
    forged = GO_NOTE.replace(b"answer", b"Answer")
    with pytest.raises(LogVerificationError, match="does not verify"):
        note.open_note(forged, [signer.verifier])


@pytest.mark.parametrize(
    "msg",
    [
        b"no blank line\n\xe2\x80\x94 a AAAAAAA=\n",
        GO_NOTE.replace(b"\xe2\x80\x94", b"-"),
        GO_NOTE.rstrip(b"\n"),
        GO_NOTE + b"\x01",
        GO_NOTE.replace(b"x08go/", b"x08go!"),
        b"\xff\xfe\n\n",
    ],
)
def test_malformed_notes_are_refused_with_a_log_error(msg: bytes) -> None:
    with pytest.raises(LogError):
        note.open_note(msg, [note.Verifier.parse(GO_VKEY)])


@pytest.mark.parametrize(
    "text",
    [
        "origin\n01\nAAAA\n",
        "origin\n1\n",
        "origin\n1\nnot base64!\n",
        "origin\n1\nAAAA\n",
        "o\n1\n" + "A" * 43 + "=\n\n",
    ],
)
def test_malformed_checkpoints_are_refused(text: str) -> None:
    with pytest.raises(LogError):
        Checkpoint.parse(text)


@pytest.mark.parametrize(
    "vkey", ["PeterNeumann+c74f20a4+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW", "a+b", "x y+00000000+AQ=="]
)
def test_bad_verifier_keys_are_refused(vkey: str) -> None:
    with pytest.raises(LogError):
        note.Verifier.parse(vkey)
