"""A local RFC 3161 timestamp authority: `openssl ts -reply` behind a tiny loopback HTTP server.

Missing openssl: a failure under CI=true (CI images have it), a skip on a developer machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

__all__ = ["openssl_tsa"]

_CONFIG = """
[ tsa ]
default_tsa = tsa_config
[ tsa_config ]
dir = .
serial = ./serial
crypto_device = builtin
signer_digest = sha256
default_policy = 1.2.3.4.1
digests = sha256, sha384, sha512
accuracy = secs:1
ordering = no
tsa_name = no
ess_cert_id_chain = no
ess_cert_id_alg = sha256
[ req ]
distinguished_name = dn
[ dn ]
[ v3_tsa ]
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = critical, timeStamping
[ v3_ca ]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
"""


@dataclass
class LocalTsa:
    url: str
    #: The TSA's root certificate (PEM): what `verify-bundle --tsa-cert` trusts.
    root: Path
    #: Requests answered.
    served: list[int]


def _openssl(directory: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def openssl_tsa() -> Iterator[LocalTsa]:
    if shutil.which("openssl") is None:
        message = "openssl is not installed (a local TSA needs `openssl ts`)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    directory = Path(tempfile.mkdtemp(prefix="archiver-tsa-"))
    (directory / "tsa.cnf").write_text(_CONFIG)
    (directory / "serial").write_text("01\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-config", "tsa.cnf"]
    _openssl(directory, "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=Archiver Test TSA Root", "-extensions", "v3_ca")  # fmt: skip
    _openssl(directory, "req", *ec, "-keyout", "tsa.key", "-out", "tsa.csr", "-subj", "/CN=Archiver Test TSA")
    _openssl(directory, "x509", "-req", "-in", "tsa.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "tsa.pem", "-days", "2", "-extfile", "tsa.cnf", "-extensions", "v3_tsa")  # fmt: skip
    served: list[int] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            query = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with lock:
                (directory / "req.tsq").write_bytes(query)
                reply_args = ["-inkey", "tsa.key", "-signer", "tsa.pem", "-chain", "tsa.pem", "-out", "resp.tsr"]
                _openssl(directory, "ts", "-reply", "-config", "tsa.cnf", "-queryfile", "req.tsq", *reply_args)
                reply = (directory / "resp.tsr").read_bytes()
                served.append(len(query))
            self.send_response(200)
            self.send_header("Content-Type", "application/timestamp-reply")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield LocalTsa(f"http://127.0.0.1:{server.server_address[1]}/tsa", directory / "ca.pem", served)
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(directory, ignore_errors=True)
