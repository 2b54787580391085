"""A quirky S3 store for the tests: a small threaded HTTP proxy on 127.0.0.1 in front of a real S3
server (SeaweedFS) that forwards every request faithfully, except where a switch of `StoreQuirks`
makes it behave as some real S3-compatible store does (README, "S3-compatible stores").

A request the proxy leaves alone goes on with its client's own SigV4 signature (the Host header
as the client sent it); one it edits (a header dropped, a completion body rewritten) is signed
again with the same credentials (SeaweedFS checks signatures: it takes the dummy test credentials
from its environment). Every write the server accepted is recorded per key (`writes`, `overwrites`),
so a test can prove that no archived object was ever written twice with other bytes.
"""

from __future__ import annotations

import hashlib
import html
import http.client
import os
import random
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, unquote_plus, urlsplit

__all__ = ["FAITHFUL", "WORST", "QuirkyS3Proxy", "StoreQuirks", "Write", "operation_of"]


@dataclass(frozen=True, slots=True)
class StoreQuirks:
    """Every switch, off by default (the proxy is then a faithful pass-through); see the field comments."""

    #: Keeps no additional checksums: ``x-amz-checksum-*`` (and the algorithm and mode headers)
    #: are dropped from requests, responses and the XML of uploads, so nothing is verified on
    #: arrival and a HEAD with ``ChecksumMode`` answers none.
    no_checksums: bool = False
    #: User metadata (``x-amz-meta-*``) is dropped on write and never answered.
    drops_metadata: bool = False
    #: ``If-None-Match`` is dropped from PutObject and CompleteMultipartUpload: the write overwrites.
    ignores_if_none_match: bool = False
    #: 501 NotImplemented (S3 XML error) to ListMultipartUploads, GetObjectLockConfiguration,
    #: PutObjectTagging and PutObjectLegalHold / GetObjectLegalHold.
    optional_calls_501: bool = False
    #: 400 InvalidArgument "Unsupported header" to CRC32 / CRC32C / CRC64NVME request checksums and
    #: ``aws-chunked`` bodies (botocore >= 1.36 sends CRC32 by default); SHA-256 and MD5 pass.
    rejects_crc32: bool = False
    #: ETags answered without their double quotes (headers and XML); taken back in either form.
    etag_unquoted: bool = False
    #: ETags answered in upper case; taken back in either case.
    etag_upper: bool = False
    #: ListObjectsV2 pages list their keys in another order than S3's byte order (shuffled).
    list_unordered: bool = False
    #: A key written less than this many seconds ago (by the proxy's clock) is left out of ListObjectsV2.
    list_lag: float = 0.0
    #: Every this many requests, the next ``slowdown_burst`` are answered 503 SlowDown with
    #: ``Retry-After: 1`` and not forwarded (0: never).
    slowdown_every: int = 0
    slowdown_burst: int = 2

    def __post_init__(self) -> None:
        if self.list_lag < 0 or self.slowdown_every < 0 or self.slowdown_burst < 1:
            raise ValueError(f"bad quirk values: {self}")


#: No switch on: the proxy forwards every request as it came.
FAITHFUL = StoreQuirks()

#: Every switch on at once: the worst store the archiver is meant to cope with.
WORST = StoreQuirks(
    no_checksums=True,
    drops_metadata=True,
    ignores_if_none_match=True,
    optional_calls_501=True,
    rejects_crc32=True,
    etag_unquoted=True,
    etag_upper=True,
    list_unordered=True,
    list_lag=5.0,
    slowdown_every=12,
)


@dataclass(frozen=True, slots=True)
class Write:
    """One write the server accepted: ``what`` tells its bytes apart (``sha256:…`` of a PutObject
    body, ``etag:…`` of a completed multipart upload, ``copy:…`` of a CopyObject source)."""

    operation: str
    bucket: str
    key: str
    what: str


# --- requests -----------------------------------------------------------------------------------

_OPTIONAL = frozenset(
    {"ListMultipartUploads", "GetObjectLockConfiguration", "PutObjectTagging", "PutObjectLegalHold",
     "GetObjectLegalHold"}
)  # fmt: skip
_WRITES = frozenset({"PutObject", "CompleteMultipartUpload", "CopyObject"})
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
     "transfer-encoding", "upgrade", "expect", "content-length"}
)  # fmt: skip
_CRC_HEADERS = ("x-amz-checksum-crc32", "x-amz-checksum-crc32c", "x-amz-checksum-crc64nvme")


def operation_of(method: str, bucket: str, key: str, query: dict[str, str], headers: dict[str, str]) -> str:
    """The S3 operation name of a path-style request (enough of them for the switches), pure."""
    if not bucket:
        return "ListBuckets"
    if not key:
        if "uploads" in query:
            return "ListMultipartUploads"
        if "object-lock" in query:
            return "GetObjectLockConfiguration" if method == "GET" else "PutObjectLockConfiguration"
        if method == "GET":
            return "ListObjectsV2" if query.get("list-type") == "2" else "ListObjects"
        return {"PUT": "CreateBucket", "DELETE": "DeleteBucket", "HEAD": "HeadBucket"}.get(method, f"{method}Bucket")
    if "tagging" in query:
        return {"PUT": "PutObjectTagging", "GET": "GetObjectTagging"}.get(method, "DeleteObjectTagging")
    if "legal-hold" in query:
        return "PutObjectLegalHold" if method == "PUT" else "GetObjectLegalHold"
    if "retention" in query:
        return "PutObjectRetention" if method == "PUT" else "GetObjectRetention"
    if method == "POST" and "uploads" in query:
        return "CreateMultipartUpload"
    if method == "POST" and "uploadId" in query:
        return "CompleteMultipartUpload"
    if method == "PUT" and "partNumber" in query:
        return "UploadPart"
    if method == "GET" and "uploadId" in query:
        return "ListParts"
    if method == "DELETE" and "uploadId" in query:
        return "AbortMultipartUpload"
    if method == "PUT":
        return "CopyObject" if "x-amz-copy-source" in headers else "PutObject"
    return {"GET": "GetObject", "HEAD": "HeadObject", "DELETE": "DeleteObject"}.get(method, f"{method}Object")


def decode_aws_chunked(body: bytes) -> bytes:
    """The payload of an ``aws-chunked`` body (``hex-size[;ext]\\r\\n data \\r\\n`` … ``0\\r\\n`` trailers)."""
    out = bytearray()
    at = 0
    while True:
        end = body.index(b"\r\n", at)
        size = int(body[at:end].split(b";", 1)[0], 16)
        if size == 0:
            return bytes(out)
        out += body[end + 2 : end + 2 + size]
        at = end + 2 + size + 2


_CHECKSUM_ELEMENT = re.compile(rb"<(Checksum[A-Za-z0-9]*)>[^<]*</\1>")
_ETAG_ELEMENT = re.compile(rb"<ETag>([^<]*)</ETag>")
_CONTENTS = re.compile(rb"<Contents>.*?</Contents>", re.DOTALL)
_KEY = re.compile(rb"<Key>([^<]*)</Key>")
_KEY_COUNT = re.compile(rb"<KeyCount>\d+</KeyCount>")


def _error(code: str, message: str, status: int) -> tuple[int, dict[str, str], bytes]:
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{html.escape(message)}</Message>'
        f"<RequestId>{uuid.uuid4().hex}</RequestId></Error>"
    ).encode()
    headers = {"Content-Type": "application/xml", "x-amz-request-id": uuid.uuid4().hex}
    if code == "SlowDown":
        headers["Retry-After"] = "1"
    return status, headers, body


def _sub_etags(xml: bytes, edit: Callable[[str], str]) -> bytes:
    """``xml`` with the value of every ``<ETag>`` element replaced by ``edit(value)``."""
    return _ETAG_ELEMENT.sub(lambda m: b"<ETag>" + edit(m[1].decode()).encode() + b"</ETag>", xml)


def _bare_etag(value: str) -> str:
    return value.replace("&quot;", "").replace("&#34;", "").strip('"').lower()


# --- the proxy ----------------------------------------------------------------------------------


class QuirkyS3Proxy:
    """The proxy: ``endpoint`` is its ``http://127.0.0.1:<port>``; ``quirks`` can be changed while
    it runs (a store that stops keeping checksums); ``clock`` (seconds) times the listing lag."""

    def __init__(
        self,
        upstream: str,
        quirks: StoreQuirks = FAITHFUL,
        *,
        clock: Callable[[], float] = time.monotonic,
        seed: int = 0,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream = (parts.hostname, parts.port)
        #: (access key id, secret key) that edited requests are signed with: the environment's by default.
        self._credentials = credentials or (os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])
        self.quirks = quirks
        self.clock = clock
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._written_at: dict[tuple[str, str], float] = {}
        self._writes: list[Write] = []
        self._requests: Counter[str] = Counter()
        self._answered: Counter[tuple[str, int]] = Counter()
        self._count = 0
        self._local = threading.local()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> QuirkyS3Proxy:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="s3-quirks", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> QuirkyS3Proxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what happened ------------------------------------------------------------------------

    def writes(self, key: str | None = None) -> list[Write]:
        """Every write the server accepted (of one key), in order."""
        with self._lock:
            return [w for w in self._writes if key is None or w.key == key]

    def overwrites(self, *, ignore: Callable[[str], bool] = lambda key: False) -> dict[str, list[str]]:
        """Keys the server accepted two writes of with other bytes: key → what each write was."""
        by_key: dict[str, list[str]] = {}
        for w in self.writes():
            if not ignore(w.key):
                by_key.setdefault(f"{w.bucket}/{w.key}", []).append(w.what)
        return {k: v for k, v in by_key.items() if len(set(v)) > 1}

    def requests(self) -> Counter[str]:
        """Requests received, by operation name (answered by the proxy itself or forwarded)."""
        with self._lock:
            return Counter(self._requests)

    def answered(self, status: int) -> Counter[str]:
        """Requests answered with ``status``, by operation name."""
        with self._lock:
            return Counter({op: n for (op, s), n in self._answered.items() if s == status})

    # --- one request --------------------------------------------------------------------------

    def handle(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes | Iterator[bytes]]:
        """(status, headers, body) for one request; the body may be an iterator of chunks (a GET streamed through)."""
        q = self.quirks
        parts = urlsplit(target)
        path = unquote(parts.path)
        bucket, _, key = path.lstrip("/").partition("/")
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        lower = {k.lower(): v for k, v in headers.items()}
        op = operation_of(method, bucket, key, query, lower)
        with self._lock:
            self._requests[op] += 1
            self._count += 1
            n = self._count
        refusal = self._refusal(q, op, lower, n)
        if refusal is not None:
            return self._answer(op, refusal)
        forward, changed = self._edit_request(q, op, headers, body)
        if changed is not None:
            # The body no longer hashes to what the client signed.
            forward = {k: v for k, v in forward.items() if k.lower() != "x-amz-content-sha256"}
            forward["X-Amz-Content-SHA256"] = "UNSIGNED-PAYLOAD"
            body = changed
        if changed is not None or len(forward) != len([h for h in headers if h.lower() not in _HOP_BY_HOP]):
            forward = self._sign(method, target, forward, body)
        response = self._send(method, target, forward, body)
        status = response.status
        out_headers = self._edit_headers(q, [(k, v) for k, v in response.getheaders()])
        if op == "GetObject" and status == 200 and response.getheader("Content-Length") is not None:
            with self._lock:
                self._answered[(op, status)] += 1
            return status, out_headers, _stream(response)
        payload = response.read()
        payload = self._edit_body(q, op, status, payload, bucket, query)
        if status == 200 and op in _WRITES and b"<Error>" not in payload:
            self._record(op, bucket, key, lower, body, response, payload)
        return self._answer(op, (status, out_headers, payload))

    def _answer(
        self, op: str, answer: tuple[int, dict[str, str], bytes]
    ) -> tuple[int, dict[str, str], bytes | Iterator[bytes]]:
        with self._lock:
            self._answered[(op, answer[0])] += 1
        return answer

    def _refusal(
        self, q: StoreQuirks, op: str, headers: dict[str, str], n: int
    ) -> tuple[int, dict[str, str], bytes] | None:
        """The proxy's own answer (the request is not forwarded), or None."""
        if q.slowdown_every and n % q.slowdown_every < q.slowdown_burst and n >= q.slowdown_every:
            return _error("SlowDown", "Please reduce your request rate.", 503)
        if q.optional_calls_501 and op in _OPTIONAL:
            return _error("NotImplemented", f"{op} is not implemented by this store", 501)
        if q.rejects_crc32:
            offending = [h for h in _CRC_HEADERS if h in headers]
            for name in ("x-amz-sdk-checksum-algorithm", "x-amz-checksum-algorithm"):
                if headers.get(name, "").upper().startswith("CRC"):
                    offending.append(name)
            if "aws-chunked" in headers.get("content-encoding", "") or "x-amz-trailer" in headers:
                offending.append("x-amz-trailer" if "x-amz-trailer" in headers else "content-encoding")
            if offending:
                return _error(
                    "InvalidArgument", f"Unsupported header '{offending[0]}' received for this API call.", 400
                )
        return None

    def _edit_request(
        self, q: StoreQuirks, op: str, headers: dict[str, str], body: bytes
    ) -> tuple[dict[str, str], bytes | None]:
        """The headers to forward and the body when it had to change (else None)."""
        forward: dict[str, str] = {}
        for name, value in headers.items():
            low = name.lower()
            if low in _HOP_BY_HOP:
                continue
            if q.no_checksums and (low.startswith("x-amz-checksum-") or low == "x-amz-sdk-checksum-algorithm"):
                continue
            if q.drops_metadata and low.startswith("x-amz-meta-"):
                continue
            if q.ignores_if_none_match and low == "if-none-match" and op in _WRITES:
                continue
            forward[name] = value
        changed: bytes | None = None
        if op == "CompleteMultipartUpload":
            edited = body
            if q.no_checksums:
                edited = _CHECKSUM_ELEMENT.sub(b"", edited)
            if q.etag_unquoted or q.etag_upper:
                # The store takes its own ETags back as it answered them: the server behind gets its form.
                edited = _sub_etags(edited, lambda etag: f'"{_bare_etag(etag)}"')
            if edited != body:
                changed = edited
        return forward, changed

    def _edit_headers(self, q: StoreQuirks, headers: list[tuple[str, str]]) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, value in headers:
            low = name.lower()
            if (low in _HOP_BY_HOP and low != "content-length") or low in ("date", "server"):
                continue  # the proxy's own Date and Server headers stand in
            if q.no_checksums and low.startswith("x-amz-checksum-"):
                continue
            if q.drops_metadata and low.startswith("x-amz-meta-"):
                continue
            if low == "etag" and (q.etag_unquoted or q.etag_upper):
                value = self._etag(q, value)
            out[name] = value
        return out

    def _etag(self, q: StoreQuirks, value: str) -> str:
        bare = _bare_etag(value)
        if q.etag_upper:
            bare = bare.upper()
        return bare if q.etag_unquoted else f'"{bare}"'

    def _edit_body(
        self, q: StoreQuirks, op: str, status: int, payload: bytes, bucket: str, query: dict[str, str]
    ) -> bytes:
        if not payload.lstrip().startswith(b"<"):
            return payload
        if q.no_checksums:
            payload = _CHECKSUM_ELEMENT.sub(b"", payload)
        if q.etag_unquoted or q.etag_upper:
            payload = _sub_etags(payload, lambda etag: self._etag(q, etag))
        if op == "ListObjectsV2" and status == 200 and (q.list_lag or q.list_unordered):
            payload = self._edit_listing(q, payload, bucket, query.get("encoding-type") == "url")
        return payload

    def _edit_listing(self, q: StoreQuirks, payload: bytes, bucket: str, url_encoded: bool) -> bytes:
        blocks = _CONTENTS.findall(payload)
        kept = blocks
        if q.list_lag:
            now = self.clock()
            with self._lock:
                written = dict(self._written_at)

            def visible(block: bytes) -> bool:
                found = _KEY.search(block)
                if found is None:
                    return True
                key = html.unescape(found[1].decode())
                key = unquote_plus(key) if url_encoded else key
                at = written.get((bucket, key))
                return at is None or now - at >= q.list_lag

            kept = [b for b in blocks if visible(b)]
        if q.list_unordered:
            kept = list(kept)
            with self._lock:
                self._random.shuffle(kept)
        replacements = iter(kept)
        payload = _CONTENTS.sub(lambda m: next(replacements, b""), payload)
        if len(kept) != len(blocks):
            payload = _KEY_COUNT.sub(f"<KeyCount>{len(kept)}</KeyCount>".encode(), payload)
        return payload

    def _record(
        self,
        op: str,
        bucket: str,
        key: str,
        headers: dict[str, str],
        body: bytes,
        response: http.client.HTTPResponse,
        payload: bytes,
    ) -> None:
        if op == "PutObject":
            data = decode_aws_chunked(body) if "aws-chunked" in headers.get("content-encoding", "") else body
            what = "sha256:" + hashlib.sha256(data).hexdigest()
        elif op == "CopyObject":
            what = "copy:" + headers.get("x-amz-copy-source", "")
        else:
            found = _ETAG_ELEMENT.search(payload)
            what = "etag:" + _bare_etag(found[1].decode() if found else str(response.getheader("ETag", "")))
        with self._lock:
            self._writes.append(Write(op, bucket, key, what))
            self._written_at[(bucket, key)] = self.clock()

    def _sign(self, method: str, target: str, headers: dict[str, str], body: bytes) -> dict[str, str]:
        """``headers`` signed again (SigV4, the region of the client's own signature) for the edited request."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        signature = next((v for k, v in headers.items() if k.lower() == "authorization"), None)
        if signature is None:
            return headers  # an anonymous request stays one
        scope = re.search(r"Credential=[^/]+/\d{8}/([^/]+)/s3/", signature)
        host = next((v for k, v in headers.items() if k.lower() == "host"), f"{self.upstream[0]}:{self.upstream[1]}")
        unsigned = {k: v for k, v in headers.items() if k.lower() not in ("authorization", "x-amz-date")}
        request = AWSRequest(method=method, url=f"http://{host}{target}", data=body, headers=unsigned)
        S3SigV4Auth(Credentials(*self._credentials), "s3", scope[1] if scope else "us-east-1").add_auth(request)
        return dict(request.headers.items())

    def _send(self, method: str, target: str, headers: dict[str, str], body: bytes) -> http.client.HTTPResponse:
        """Forward on this thread's upstream connection (a fresh one if the kept one was closed)."""
        for attempt in (1, 2):
            conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
            if conn is None:
                conn = http.client.HTTPConnection(*self.upstream, timeout=120)
                self._local.conn = conn
            try:
                conn.request(method, target, body=body if body or method in ("PUT", "POST") else None, headers=headers)
                return conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def _stream(response: http.client.HTTPResponse) -> Iterator[bytes]:
    while chunk := response.read(256 * 1024):
        yield chunk


def _read_chunked(rfile: Any) -> bytes:
    out = bytearray()
    while True:
        size = int(rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            while rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return bytes(out)
        out += rfile.read(size)
        rfile.readline()


def _handler_for(proxy: QuirkyS3Proxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _any(self) -> None:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                body = _read_chunked(self.rfile)
            else:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, headers, payload = proxy.handle(self.command, self.path, dict(self.headers.items()), body)
            self.send_response(status)
            for name, value in headers.items():
                if name.lower() != "content-length":
                    self.send_header(name, value)
            length = next((v for k, v in headers.items() if k.lower() == "content-length"), None)
            if isinstance(payload, bytes) and self.command != "HEAD":
                length = str(len(payload))
            if length is not None:
                self.send_header("Content-Length", length)
            self.end_headers()
            if self.command == "HEAD":
                return
            for chunk in [payload] if isinstance(payload, bytes) else payload:
                self.wfile.write(chunk)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per request on stderr would drown a failure report

    return Handler
