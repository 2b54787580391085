"""Streamed bodies (`Download`) over real loopback sockets (plain and TLS): a chunked body is read by
httpx's own parser, whole, with its connection kept; a large body with a Content-Length is read past
that parser from httpcore's public `network_stream` extension, whole, on a connection not reused;
every broken or stalled body is one `ApiTransportError`, whichever path read it."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator

import httpx
import pytest

from archiver.config.credentials import Token
from archiver.errors import ApiTransportError
from archiver.upstream.api import SessionHostClient
from archiver.upstream.transport import DIRECT_MIN_BYTES
from tests.fixtures_http import TLSFiles

_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-tar\r\nTransfer-Encoding: chunked\r\n\r\n"


def frame(chunks: list[bytes], *, extension: bytes = b"", trailers: bytes = b"") -> bytes:
    """`chunks` in chunked framing (each size line with `extension`), last-chunk, `trailers`, end."""
    out = b"".join(b"%x%s\r\n%s\r\n" % (len(c), extension, c) for c in chunks if c)
    return out + b"0" + extension + b"\r\n" + trailers + b"\r\n"


def fixed(body: bytes) -> bytes:
    """A response with `body` and its Content-Length."""
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/x-tar\r\nContent-Length: %d\r\n\r\n" % len(body) + body


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


def _direct(client: SessionHostClient) -> tuple[bytes, int]:
    """The body read with `iter_direct`, and how many of its bytes went through httpx's parser
    (what httpx counts is what went through h11)."""
    with client.open_artifact("s-1", "replay.tar.gz") as download:
        body = b"".join(download.iter_direct())
        return body, download._response.num_bytes_downloaded


def _parsed(client: SessionHostClient) -> bytes:
    with client.open_artifact("s-1", "replay.tar.gz") as download:
        return b"".join(download.iter_bytes())


_BODY = [bytes([i]) * (1000 + 37 * i) for i in range(40)] + [b"x" * 300_000]
_LARGE = bytes(range(256)) * (DIRECT_MIN_BYTES // 256 + 1000)  # past DIRECT_MIN_BYTES


def test_a_chunked_artifact_is_read_whole_by_httpx_and_keeps_its_connection(raw_server: RawServer) -> None:
    raw_server.pieces = [_HEAD + frame(_BODY, extension=b";ext=1", trailers=b"X-Sum: 1\r\n")]
    whole = b"".join(_BODY)
    with _client(raw_server.url) as client:
        for _ in range(3):
            assert _direct(client) == (whole, len(whole))  # every byte through httpx's parser
        assert _parsed(client) == whole
    assert raw_server.connections == 1


def test_a_chunked_body_in_tiny_sends_is_read_whole(raw_server: RawServer) -> None:
    raw = frame(_BODY)
    # The headers and the first framing bytes in one send, then sends cutting size lines, data and
    # CRLFs anywhere.
    raw_server.pieces = [_HEAD + raw[:5], *[raw[i : i + 3] for i in range(5, 200, 3)], raw[200:]]
    with _client(raw_server.url) as client:
        assert _direct(client)[0] == b"".join(_BODY)


def test_a_body_left_half_read_closes_its_connection_and_the_next_read_is_whole(raw_server: RawServer) -> None:
    raw_server.pieces = [_HEAD + frame(_BODY)]
    with _client(raw_server.url) as client:
        with client.open_artifact("s-1", "a") as download:
            first = next(iter(download.iter_direct()))
            assert first and b"".join(_BODY).startswith(first)
        assert _direct(client)[0] == b"".join(_BODY)
    assert raw_server.connections == 2


@pytest.mark.parametrize(
    "framing",
    [
        b"5\r\nabcde\r\nzz\r\n",  # malformed size line
        b"5\r\nabcde\r\n100\r\nabc",  # truncated mid-chunk
        b"5\r\nabcde\r\n",  # truncated before last-chunk
        b"3\r\nabcde\r\n0\r\n\r\n",  # size lies
    ],
)
def test_a_broken_chunked_body_raises_one_transport_error_on_either_read(raw_server: RawServer, framing: bytes) -> None:
    raw_server.pieces, raw_server.then = [_HEAD + framing], "close"
    with _client(raw_server.url) as client:
        for read in (_parsed, _direct):
            with pytest.raises(ApiTransportError, match="broke mid-body"):
                read(client)


def test_a_chunked_body_that_stalls_raises_after_the_read_timeout(raw_server: RawServer) -> None:
    raw_server.pieces, raw_server.then = [_HEAD + b"5\r\nabcde\r\n"], "stall"
    with _client(raw_server.url) as client, pytest.raises(ApiTransportError, match="ReadTimeout"):
        _direct(client)


def test_a_large_body_with_a_length_is_read_past_httpx_whole_on_a_new_connection_each(raw_server: RawServer) -> None:
    # The headers and the body's first bytes in one send (httpx's parser hands those over), the
    # rest in pieces.
    response = fixed(_LARGE)
    cut = len(response) - len(_LARGE) + 1000
    raw_server.pieces = [response[:cut], *[response[i : i + 70_000] for i in range(cut, len(response), 70_000)]]
    with _client(raw_server.url) as client:
        for _ in range(2):
            body, through_httpx = _direct(client)
            assert body == _LARGE
            assert 0 < through_httpx < len(_LARGE)  # only the first chunk went through httpx's parser
    assert raw_server.connections == 2  # read directly: the connection is not reused


def test_a_large_body_cut_short_or_stalled_raises_one_transport_error(raw_server: RawServer) -> None:
    raw_server.pieces, raw_server.then = [fixed(_LARGE)[: -len(_LARGE) // 2]], "close"
    with _client(raw_server.url) as client, pytest.raises(ApiTransportError, match="broke mid-body: ReadError"):
        _direct(client)
    raw_server.then = "stall"
    with _client(raw_server.url) as client, pytest.raises(ApiTransportError, match="broke mid-body: ReadTimeout"):
        _direct(client)


def test_bodies_over_tls_are_read_decrypted_and_whole(self_signed_cert: TLSFiles) -> None:
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(self_signed_cert.cert, self_signed_cert.key)
    server = RawServer(tls)
    verify = ssl.create_default_context(cafile=str(self_signed_cert.cert))
    try:
        server.pieces = [_HEAD + frame(_BODY)]
        with _client(server.url, httpx.HTTPTransport(verify=verify)) as client:
            assert _direct(client)[0] == _direct(client)[0] == b"".join(_BODY)
        assert server.connections == 1  # chunked: the connection is kept
        server.pieces = [fixed(_LARGE)]
        with _client(server.url, httpx.HTTPTransport(verify=verify)) as client:
            body, through_httpx = _direct(client)
            assert body == _LARGE and through_httpx < len(_LARGE)
    finally:
        server.close()
