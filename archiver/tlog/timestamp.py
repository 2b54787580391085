"""RFC 3161 timestamps of signed checkpoints: ask a TSA (``--tlog-tsa-url``), check a reply, verify it against roots.

A timestamp binds the SHA-256 of a checkpoint's exact signed bytes to the TSA's clock: with it, a
bundle proves the archive was in the log no later than the TSA's ``genTime``, on the word of a
third party rather than the studio's. Replies are kept create-once at ``timestamps/<size>`` beside
the log's checkpoints; ``prove`` puts the one of the bundle's checkpoint into the bundle.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import httpx
from cryptography import x509
from rfc3161_client import (
    HashAlgorithm,
    PKIStatus,
    TimestampRequestBuilder,
    TimeStampResponse,
    VerificationError,
    VerifierBuilder,
    decode_timestamp_response,
)

from archiver.errors import LogError, LogVerificationError

REQUEST_TYPE = "application/timestamp-query"
REPLY_TYPE = "application/timestamp-reply"
TIMEOUT = 10.0


def timestamps_path(size: int) -> str:
    """``timestamps/<size, 20 digits>``: the TSA's reply for the checkpoint of that size."""
    return f"timestamps/{size:020d}"


@dataclass(frozen=True, slots=True)
class Stamp:
    """What a checked timestamp says."""

    time: datetime
    #: The TSA's certificate subject (or serial number when it sent no certificate).
    authority: str
    verified: bool


def _decode(reply: bytes) -> TimeStampResponse:
    try:
        return decode_timestamp_response(reply)
    except ValueError as exc:
        raise LogError(f"not an RFC 3161 timestamp reply ({exc})") from None


def check(reply: bytes, data: bytes, roots: Sequence[x509.Certificate] = ()) -> Stamp:
    """The timestamp of ``data`` in ``reply``: granted, over SHA-256(data); with ``roots``, its
    signature and certificate chain verified (``LogVerificationError`` otherwise)."""
    response = _decode(reply)
    if response.status not in (PKIStatus.GRANTED, PKIStatus.GRANTED_WITH_MODS):
        raise LogVerificationError(f"the TSA refused the timestamp (status {response.status})")
    info = response.tst_info
    if info.message_imprint.message != hashlib.sha256(data).digest():
        raise LogVerificationError("the timestamp is of other bytes than this checkpoint")
    verified = False
    if roots:
        builder = VerifierBuilder()
        for root in roots:
            builder = builder.add_root_certificate(root)
        try:
            verified = builder.build().verify_message(response, data)
        except VerificationError as exc:
            raise LogVerificationError(f"the timestamp's signature does not verify: {exc}") from None
        if not verified:
            raise LogVerificationError("the timestamp's signature does not verify")
    authority = f"serial {info.serial_number}"
    for der in response.signed_data.certificates:
        cert = x509.load_der_x509_certificate(der)
        authority = cert.subject.rfc4514_string()
        break
    return Stamp(info.gen_time, authority, verified)


def request(url: str, data: bytes, *, timeout: float = TIMEOUT) -> bytes:
    """Ask the TSA at ``url`` for a timestamp of ``data``; its reply once checked (``LogError`` when
    the TSA cannot be reached or answers something else)."""
    tsq = TimestampRequestBuilder().data(data).hash_algorithm(HashAlgorithm.SHA256).build()
    try:
        answer = httpx.post(url, content=tsq.as_bytes(), headers={"Content-Type": REQUEST_TYPE}, timeout=timeout)
    except httpx.HTTPError as exc:
        raise LogError(f"the TSA at {url} cannot be reached: {type(exc).__name__}") from None
    if answer.status_code != 200:
        raise LogError(f"the TSA at {url} answered HTTP {answer.status_code}")
    reply = answer.content
    check(reply, data)
    if _decode(reply).tst_info.nonce != tsq.nonce:
        raise LogVerificationError("the TSA's reply does not carry our request's nonce")
    return reply
