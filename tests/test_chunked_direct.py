"""Chunked bodies read past httpx's HTTP/1.1 parser (`Download.iter_chunked_direct`, `decode_chunked`):
hostile framings against the decoder over arbitrary read boundaries, and over real loopback sockets
(plain and TLS) the same bytes as `iter_bytes` with none through httpx (the proof that the direct
path was taken), one `ApiTransportError` for every broken body, and the connection reused exactly
when the body ended where the reads did."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator

import httpcore
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archiver.credentials import Token
from archiver.errors import ApiTransportError
from archiver.upstream.api import Download, SessionHostClient
from archiver.upstream.chunked import MAX_LINE, decode_chunked
from archiver.upstream.transport import _h11_connection
from tests.fixtures_http import TLSFiles

_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-tar\r\nTransfer-Encoding: chunked\r\n\r\n"


def frame(chunks: list[bytes], *, extension: bytes = b"", trailers: bytes = b"", upper: bool = False) -> bytes:
    """`chunks` in chunked framing (each size line with `extension`), last-chunk, `trailers`, end."""
    size = b"%X" if upper else b"%x"
    out = b"".join(size % len(c) + b"%s\r\n%s\r\n" % (extension, c) for c in chunks if c)
    return out + b"0" + extension + b"\r\n" + trailers + b"\r\n"


def reads(raw: bytes, cuts: list[int]) -> Iterator[bytes]:
    """`raw` as a connection would hand it out, cut at `cuts` (then the peer closes)."""
    start = 0
    for cut in sorted(set(cuts)):
        if start < cut < len(raw):
            yield raw[start:cut]
            start = cut
    yield raw[start:]


def decode(raw: bytes, cuts: list[int], buffered: int = 0) -> bytes:
    pieces = reads(raw[buffered:], cuts)
    return b"".join(decode_chunked(raw[:buffered], lambda: next(pieces, b"")))


@settings(max_examples=150, deadline=None)
@given(
    chunks=st.lists(st.binary(min_size=0, max_size=300), max_size=12),
    extension=st.sampled_from([b"", b";name=value", b' ;a;b="q s"', b"\t;x"]),
    trailers=st.sampled_from([b"", b"Digest: sha-256=abc\r\n", b"A: 1\r\nB-c: two words\r\n"]),
    upper=st.booleans(),
    data=st.data(),
)
def test_any_framing_cut_at_any_read_boundaries_decodes_to_exactly_the_body(
    chunks: list[bytes], extension: bytes, trailers: bytes, upper: bool, data: st.DataObject
) -> None:
    raw = frame(chunks, extension=extension, trailers=trailers, upper=upper)
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=20))
    buffered = data.draw(st.integers(0, len(raw)))
    # Bytes past the body's end (a next response) are not read.
    assert decode(raw + b"HTTP/1.1 200 OK\r\n", cuts, buffered) == b"".join(chunks)


def test_one_huge_chunk_comes_out_as_the_reads_themselves_and_many_tiny_ones_join_up() -> None:
    huge = bytes(range(256)) * 4096  # 1 MiB
    raw = frame([huge])
    pieces = list(reads(raw, list(range(0, len(raw), 65536))))
    out = list(decode_chunked(b"", iter(pieces).__next__))
    assert b"".join(out) == huge
    assert any(piece is chunk for piece in pieces for chunk in out)  # a read inside the chunk is not copied
    tiny = [bytes([i % 256]) for i in range(5000)]
    assert decode(frame(tiny), [7, 8, 9, 1000]) == b"".join(tiny)


@pytest.mark.parametrize(
    ("raw", "error", "why"),
    [
        (b"zz\r\nab\r\n0\r\n\r\n", httpcore.RemoteProtocolError, "not hex"),
        (b"-2\r\nab\r\n0\r\n\r\n", httpcore.RemoteProtocolError, "negative size"),
        (b"0x2\r\nab\r\n0\r\n\r\n", httpcore.RemoteProtocolError, "0x prefix"),
        (b"1" * 17 + b"\r\nab\r\n0\r\n\r\n", httpcore.RemoteProtocolError, "oversized size"),
        (b"\r\nab\r\n0\r\n\r\n", httpcore.RemoteProtocolError, "empty size line"),
        (b"2\nab\r\n0\r\n\r\n", httpcore.RemoteProtocolError, "bare LF"),
        (b"2;a\x01\r\nab\r\n0\r\n\r\n", httpcore.RemoteProtocolError, "control character in extension"),
        (b"2\r\nabc\r\n0\r\n\r\n", httpcore.RemoteProtocolError, "chunk longer than its size"),
        (b"2\r\nab0\r\n\r\n", httpcore.RemoteProtocolError, "CRLF missing after data"),
        (b"2\r\nab\r\n0\r\nno colon\r\n\r\n", httpcore.RemoteProtocolError, "malformed trailer"),
        (b"1" * (MAX_LINE + 1), httpcore.RemoteProtocolError, "endless size line"),
        (b"0\r\n" + b"A: b\r\n" * 20000, httpcore.RemoteProtocolError, "endless trailers"),
        (b"", httpcore.ReadError, "nothing at all"),
        (b"5\r\nab", httpcore.ReadError, "truncated mid-chunk"),
        (b"2\r\nab", httpcore.ReadError, "truncated before the chunk's CRLF"),
        (b"2\r\nab\r\n", httpcore.ReadError, "truncated before last-chunk"),
        (b"2\r\nab\r\n0\r\nA: b\r\n", httpcore.ReadError, "truncated in the trailers"),
    ],
)
def test_a_malformed_or_truncated_framing_raises_and_never_ends_quietly(
    raw: bytes, error: type[Exception], why: str
) -> None:
    for cuts in ([], [1], list(range(len(raw)))):
        with pytest.raises(error):
            decode(raw, cuts)


class RawServer:
    """A loopback HTTP/1.1 server that answers each request with `pieces` (raw bytes, one `sendall`
    each), then keeps the connection for the next request (`then="keep"`), closes it, or holds it
    silent until the test ends (`"stall"`). It counts the connections it accepted."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.pieces: list[bytes] = []
        self.then = "keep"
        self.connections = 0
        self._tls = tls
        self._done = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self._tls is not None:
                conn = self._tls.wrap_socket(conn, server_side=True)
            received = b""
            while True:
                while b"\r\n\r\n" not in received:
                    data = conn.recv(65536)
                    if not data:
                        return
                    received += data
                received = received.split(b"\r\n\r\n", 1)[1]  # GET: no request body
                for piece in self.pieces:
                    conn.sendall(piece)
                if self.then == "stall":
                    self._done.wait()
                if self.then != "keep":
                    return
        except OSError:
            return  # the client went away
        finally:
            conn.close()

    def close(self) -> None:
        self._done.set()
        self._listener.close()


@pytest.fixture
def raw_server() -> Iterator[RawServer]:
    server = RawServer()
    yield server
    server.close()


def _client(url: str, transport: httpx.BaseTransport | None = None) -> SessionHostClient:
    return SessionHostClient.connect(url, Token("t"), timeout=httpx.Timeout(5.0, read=0.3), transport=transport)


def _direct(client: SessionHostClient) -> bytes:
    """The body read with `iter_direct`; asserts that httpx's parser saw none of it (what httpx
    counts is what went through h11), which fails if the direct path is silently not taken."""
    with client.open_artifact("s-1", "replay.tar.gz") as download:
        body = b"".join(download.iter_direct())
        assert download._response.num_bytes_downloaded == 0
        return body


def _parsed(client: SessionHostClient) -> bytes:
    with client.open_artifact("s-1", "replay.tar.gz") as download:
        return b"".join(download.iter_bytes())


_BODY = [bytes([i]) * (1000 + 37 * i) for i in range(40)] + [b"x" * 300_000]


def test_a_chunked_artifact_read_directly_equals_iter_bytes_and_keeps_its_connection(raw_server: RawServer) -> None:
    """Read past h11 (`_direct` checks httpx saw no byte), h11 is then told the body ended: the
    connection serves the next requests, direct or not."""
    raw_server.pieces = [_HEAD + frame(_BODY, extension=b";ext=1", trailers=b"X-Sum: 1\r\n")]
    with _client(raw_server.url) as client:
        assert _direct(client) == _direct(client) == _parsed(client) == _direct(client) == b"".join(_BODY)
    assert raw_server.connections == 1


@pytest.mark.parametrize(
    ("head", "tail"),
    [
        (_HEAD, b"HTTP/1.1 200 OK\r\n"),  # bytes past the body's end: the next response is not trusted
        (_HEAD.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"), b""),
    ],
    ids=["bytes-past-the-end", "connection-close"],
)
def test_a_connection_with_bytes_past_the_body_or_marked_close_is_not_reused(
    raw_server: RawServer, head: bytes, tail: bytes
) -> None:
    raw_server.pieces = [head + frame(_BODY) + tail]
    with _client(raw_server.url) as client:
        assert _direct(client) == _direct(client) == b"".join(_BODY)
    assert raw_server.connections == 2


def test_a_body_left_half_read_closes_its_connection_and_the_next_read_is_whole(raw_server: RawServer) -> None:
    raw_server.pieces = [_HEAD + frame(_BODY)]
    with _client(raw_server.url) as client:
        with client.open_artifact("s-1", "a") as download:
            first = next(iter(download.iter_direct()))
            assert first and b"".join(_BODY).startswith(first)
        assert _direct(client) == b"".join(_BODY)
    assert raw_server.connections == 2


def test_the_h11_connection_is_reached_on_a_real_response_before_its_body_is_read(raw_server: RawServer) -> None:
    raw_server.pieces = [_HEAD, frame([b"abc"])]
    with _client(raw_server.url) as client, client.open_artifact("s-1", "a") as download:
        assert isinstance(download, Download)
        state = _h11_connection(download._response)
        assert state is not None
        assert b"".join(download.iter_direct()) == b"abc"


def test_bytes_h11_buffered_with_the_headers_and_bytes_in_tiny_sends_are_all_decoded(raw_server: RawServer) -> None:
    raw = frame(_BODY)
    # The headers and the first framing bytes in one send (h11 buffers them), then sends cutting
    # size lines, data and CRLFs anywhere.
    raw_server.pieces = [_HEAD + raw[:5], *[raw[i : i + 3] for i in range(5, 200, 3)], raw[200:]]
    with _client(raw_server.url) as client:
        assert _direct(client) == b"".join(_BODY)


@pytest.mark.parametrize(
    "framing",
    [
        b"5\r\nabcde\r\nzz\r\n",  # malformed size line
        b"5\r\nabcde\r\n100\r\nabc",  # truncated mid-chunk
        b"5\r\nabcde\r\n",  # truncated before last-chunk
        b"3\r\nabcde\r\n0\r\n\r\n",  # size lies
    ],
)
def test_a_broken_chunked_body_raises_the_same_error_as_iter_bytes(raw_server: RawServer, framing: bytes) -> None:
    raw_server.pieces, raw_server.then = [_HEAD + framing], "close"
    with _client(raw_server.url) as client:
        for read in (_parsed, _direct):
            with pytest.raises(ApiTransportError, match="broke mid-body"):
                read(client)


def test_a_chunked_body_that_stalls_raises_after_the_read_timeout(raw_server: RawServer) -> None:
    raw_server.pieces, raw_server.then = [_HEAD + b"5\r\nabcde\r\n"], "stall"
    with _client(raw_server.url) as client, pytest.raises(ApiTransportError, match="ReadTimeout"):
        _direct(client)


def test_a_chunked_body_over_tls_is_read_directly_decrypted_and_whole(self_signed_cert: TLSFiles) -> None:
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(self_signed_cert.cert, self_signed_cert.key)
    server = RawServer(tls)
    server.pieces = [_HEAD + frame(_BODY)]
    transport = httpx.HTTPTransport(verify=ssl.create_default_context(cafile=str(self_signed_cert.cert)))
    try:
        with _client(server.url, transport) as client:
            assert _direct(client) == _direct(client) == b"".join(_BODY)
    finally:
        server.close()
    assert server.connections == 1
