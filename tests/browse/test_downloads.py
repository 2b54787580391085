"""Browser downloads that resume and revalidate: a strong ETag from the item's sha256, 304 on
If-None-Match, 206 with Content-Range for one byte range read from the store as a ranged GET (a
seek on a directory store), 416 past the end, over real sockets against a directory store and moto."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from archiver.browse import ranges
from archiver.browse.app import BrowseApp
from archiver.browse.server import BrowseServer
from archiver.store import ObjectStore, make_s3_client, open_store
from tests.support import NOW, put_session

#: An artifact larger than one read chunk of either store, so ranges cross chunk boundaries.
DATA = os.urandom(3 * 1024 * 1024 + 12345)
SIZE = len(DATA)
TAG = f'"{hashlib.sha256(DATA).hexdigest()}"'


class _Recording:
    """The real store, noting which read of an item's object each download made (whole or ranged;
    the manifest's reads are not noted)."""

    def __init__(self, inner: ObjectStore) -> None:
        self._inner = inner
        self.reads: list[tuple[str, tuple[int, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def iter_bytes(self, key: str, **kwargs: Any) -> Iterator[bytes]:
        if not key.endswith(".json"):
            self.reads.append(("whole", ()))
        return self._inner.iter_bytes(key, **kwargs)

    def iter_range(self, key: str, first: int, last: int, **kwargs: Any) -> Iterator[bytes]:
        self.reads.append(("range", (first, last)))
        return self._inner.iter_range(key, first, last, **kwargs)


@pytest.fixture(scope="module", params=["file", "s3"])
def browser(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, _Recording]]:
    """The browser over a directory store or an S3 store (moto) holding one session whose item 1 is
    DATA, and its download URL: archived once per store, as every test here only reads."""
    if request.param == "s3":
        endpoint = str(request.getfixturevalue("moto_endpoint"))
        bucket = f"downloads-{uuid.uuid4().hex[:20]}"
        make_s3_client(endpoint_url=endpoint).create_bucket(Bucket=bucket)
        store = open_store(f"s3://{bucket}/archive/", s3_endpoint_url=endpoint)
    else:
        root = tmp_path_factory.mktemp("downloads") / "archive"
        root.mkdir()
        store = open_store(root.as_uri())
    try:
        put_session(store, "s-1", ended_at=NOW - 60, artifacts={"/srv/replays/match.dem": DATA})
        recording = _Recording(store)
        with BrowseServer(("127.0.0.1", 0), BrowseApp(recording)) as server:  # type: ignore[arg-type]
            yield f"{server.url}/sessions/s-1/items/1", recording
    finally:
        store.close()


@pytest.fixture
def served(browser: tuple[str, _Recording]) -> tuple[str, _Recording]:
    """The download URL and the store's record of this test's reads (none yet)."""
    url, recording = browser
    recording.reads.clear()
    return url, recording


def test_a_whole_download_names_its_etag_and_accepts_ranges(served: tuple[str, _Recording]) -> None:
    url, recording = served
    response = httpx.get(url, timeout=30)
    assert response.status_code == 200 and response.content == DATA
    assert response.headers["etag"] == TAG and response.headers["accept-ranges"] == "bytes"
    assert response.headers["x-archive-sha256"] == TAG.strip('"')
    assert recording.reads == [("whole", ())]


@pytest.mark.parametrize("if_none_match", [TAG, f"W/{TAG}", f'"other", {TAG}', "*"])
def test_if_none_match_of_the_item_answers_304_without_a_body(
    served: tuple[str, _Recording], if_none_match: str
) -> None:
    url, recording = served
    with httpx.Client(timeout=30) as client:
        response = client.get(url, headers={"If-None-Match": if_none_match})
        assert response.status_code == 304 and response.content == b""
        assert response.headers["etag"] == TAG and "content-length" not in response.headers
        # The connection stays usable: a 304 has no body to delimit.
        assert client.get(url).content == DATA
    assert recording.reads == [("whole", ())]  # the 304 read nothing


def test_another_etag_in_if_none_match_gets_the_object(served: tuple[str, _Recording]) -> None:
    url, _ = served
    response = httpx.get(url, headers={"If-None-Match": '"' + "0" * 64 + '"'}, timeout=30)
    assert response.status_code == 200 and response.content == DATA


@pytest.mark.parametrize(
    ("header", "first", "last"),
    [
        ("bytes=100-199", 100, 199),
        ("bytes=0-0", 0, 0),
        (f"bytes={SIZE - 10}-", SIZE - 10, SIZE - 1),
        ("bytes=-50", SIZE - 50, SIZE - 1),
        (f"bytes=1048570-{10**12}", 1048570, SIZE - 1),  # past the end: cut to it
        (f"bytes=-{SIZE * 2}", 0, SIZE - 1),
    ],
)
def test_one_byte_range_is_a_206_read_from_the_store_as_a_range(
    served: tuple[str, _Recording], header: str, first: int, last: int
) -> None:
    url, recording = served
    response = httpx.get(url, headers={"Range": header}, timeout=30)
    assert response.status_code == 206
    assert response.headers["content-range"] == f"bytes {first}-{last}/{SIZE}"
    assert int(response.headers["content-length"]) == last - first + 1
    assert response.content == DATA[first : last + 1]
    assert response.headers["etag"] == TAG
    assert recording.reads == [("range", (first, last))]


def test_a_range_past_the_end_is_416(served: tuple[str, _Recording]) -> None:
    url, recording = served
    for header in (f"bytes={SIZE}-", f"bytes={SIZE + 5}-{SIZE + 10}", "bytes=-0"):
        response = httpx.get(url, headers={"Range": header}, timeout=30)
        assert response.status_code == 416, header
        assert response.headers["content-range"] == f"bytes */{SIZE}" and response.content == b""
    assert recording.reads == []


@pytest.mark.parametrize("header", ["bytes=0-9,20-29", "bytes=abc", "bytes=9-1", "items=0-9", "bytes="])
def test_several_or_malformed_ranges_get_the_whole_object(served: tuple[str, _Recording], header: str) -> None:
    url, _ = served
    response = httpx.get(url, headers={"Range": header}, timeout=30)
    assert response.status_code == 200 and response.content == DATA


def test_a_cut_download_resumes_with_if_range_and_matches_the_manifest(served: tuple[str, _Recording]) -> None:
    """What a browser or `curl -C -` does: keep what came, ask for the rest if it is still the same object."""
    url, _ = served
    received = bytearray()
    with httpx.stream("GET", url, timeout=30) as response:
        tag = response.headers["etag"]
        for chunk in response.iter_raw():
            received += chunk
            if len(received) >= SIZE // 3:
                break  # the connection drops
    rest = httpx.get(url, headers={"Range": f"bytes={len(received)}-", "If-Range": tag}, timeout=30)
    assert rest.status_code == 206
    assert hashlib.sha256(bytes(received) + rest.content).hexdigest() == tag.strip('"')
    # Another version's tag (or a date) in If-Range: the whole object, not a splice of two.
    stale = httpx.get(url, headers={"Range": "bytes=10-", "If-Range": '"' + "1" * 64 + '"'}, timeout=30)
    assert stale.status_code == 200 and stale.content == DATA
    dated = httpx.get(url, headers={"Range": "bytes=10-", "If-Range": "Fri, 27 Nov 2026 10:00:00 GMT"}, timeout=30)
    assert dated.status_code == 200 and dated.content == DATA


def test_head_of_a_range_sends_its_headers_and_reads_nothing(served: tuple[str, _Recording]) -> None:
    url, recording = served
    response = httpx.head(url, headers={"Range": "bytes=10-19"}, timeout=30)
    assert response.status_code == 206 and response.headers["content-range"] == f"bytes 10-19/{SIZE}"
    assert response.headers["content-length"] == "10"
    assert recording.reads == []


@pytest.mark.parametrize(
    ("size", "range_header", "if_range", "expected"),
    [
        (0, "bytes=0-", None, ranges.Answer(416)),
        (10, None, None, ranges.Answer(200, 0, 9)),
        (10, "bytes=2-4", TAG, ranges.Answer(206, 2, 4)),
        (10, "bytes=2-4", f"W/{TAG}", ranges.Answer(200, 0, 9)),  # If-Range compares strongly
        (10, "bytes= 2-4", None, ranges.Answer(206, 2, 4)),
        (10, "BYTES=2-4", None, ranges.Answer(206, 2, 4)),
        (10, "bytes=" + "9" * 30 + "-", None, ranges.Answer(200, 0, 9)),  # no such position
        (10, "bytes=-", None, ranges.Answer(200, 0, 9)),
    ],
)
def test_the_range_decision(size: int, range_header: str | None, if_range: str | None, expected: ranges.Answer) -> None:
    assert (
        ranges.answer(size=size, tag=TAG, range_header=range_header, if_range=if_range, if_none_match=None) == expected
    )


def test_an_item_without_a_sha256_has_no_etag_and_ignores_if_range() -> None:
    assert ranges.answer(size=10, tag=None, range_header="bytes=1-2", if_range=TAG, if_none_match=TAG).status == 200
    assert ranges.answer(size=10, tag=None, range_header="bytes=1-2", if_range=None, if_none_match="*").status == 206
