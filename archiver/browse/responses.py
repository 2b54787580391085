"""What the browser sends (`Response`), and its two attachments: an item's stored object and an archive's proof bundle.

Both are sent as ``application/octet-stream`` under a ``Content-Disposition`` name built only from
safe characters (``views.download_name``), whatever the manifest says: a browser must never render
stored bytes. A stored object streams chunk by chunk from the store and is resumable (ETag, 304,
206 and 416, as ``archiver.browse.ranges`` decides); a proof bundle is built now and never cached.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import quote

from archiver.browse import ranges, views
from archiver.errors import ObjectNotFoundError
from archiver.retrieval.query import item_key, load_archive, quiet
from archiver.store.base import ObjectStore
from archiver.tlog.prove import prove

_OCTETS = "application/octet-stream"


@dataclass
class Response:
    """What to send: status, headers, and the body as chunks (``length`` known up front or ``None``)."""

    status: int
    content_type: str
    body: Iterable[bytes]
    length: int | None
    headers: dict[str, str] = field(default_factory=dict)


def proof_response(store: ObjectStore, sid: str, instance: str | None) -> Response:
    """The archive's transparency log proof bundle (`archiver prove`), built now against the log's
    current checkpoint; the browser holds no key: whoever receives it verifies it."""
    loaded = load_archive(store, sid, instance, note=quiet)
    bundle = prove(store, None, sid, loaded.ref.instance)
    name = views.download_name(sid, loaded.ref.instance, "proof.json")
    return Response(200, _OCTETS, iter([bundle]), len(bundle), _attachment(name, "no-store"))


def download_response(
    store: ObjectStore, sid: str, instance: str | None, number: int, headers: Mapping[str, str]
) -> Response | None:
    """The stored object of item ``number``, streamed as is (gzip bytes: its sha256 is the
    manifest's), resumable: its sha256 is a strong ETag, If-None-Match answers 304, one byte
    Range 206 read from the store as a ranged GET (`archiver.browse.ranges` decides).
    None when the item has no stored object (no such item, or not archived)."""
    loaded = load_archive(store, sid, instance, note=quiet)
    items = loaded.manifest.items
    if number >= len(items) or items[number].outcome != "archived":
        return None
    item = items[number]
    key, relative = item_key(store, sid, item, loaded.ref.instance)
    info = store.head(key)
    if info is None:
        raise ObjectNotFoundError(key)
    tag = ranges.etag(item.sha256) if item.sha256 else None
    extra = _attachment(views.download_name(sid, loaded.ref.instance, relative), "private, max-age=3600")
    extra["Accept-Ranges"] = "bytes"
    if tag is not None:
        extra["ETag"] = tag
        extra["X-Archive-Sha256"] = item.sha256 or ""
    decided = ranges.answer(
        size=info.size,
        tag=tag,
        range_header=headers.get("range"),
        if_range=headers.get("if-range"),
        if_none_match=headers.get("if-none-match"),
    )
    content_range = decided.content_range(info.size)
    if content_range is not None:
        extra["Content-Range"] = content_range
    if decided.status in (304, 416):
        return Response(decided.status, _OCTETS, (), 0, extra)
    if decided.status == 206:
        return Response(206, _OCTETS, _stream(store, key, (decided.first, decided.last)), decided.length, extra)
    return Response(200, _OCTETS, _stream(store, key), info.size, extra)


def _attachment(name: str, cache_control: str) -> dict[str, str]:
    return {
        "Content-Disposition": f"attachment; filename=\"{name}\"; filename*=UTF-8''{quote(name)}",
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": cache_control,
    }


def _stream(store: ObjectStore, key: str, byte_range: tuple[int, int] | None = None) -> Iterator[bytes]:
    # Opened only when the server starts sending (a HEAD never opens it); closing this generator,
    # as the server does when the client leaves, closes the store's file or HTTP stream.
    chunks = store.iter_bytes(key) if byte_range is None else store.iter_range(key, *byte_range)
    try:
        yield from chunks
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
