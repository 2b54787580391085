"""The browser's URLs: where it is mounted (external URL, route prefix) and the path of every page it links.

Prometheus's convention: ``--web.external-url`` is the public URL, and its path is the prefix of
every link; the server answers under the route prefix, the same path unless ``--web.route-prefix``
says otherwise (a proxy that strips the public path forwards to ``/``). Every link a page carries
is built here, already prefixed, so none is root-absolute by accident.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import quote, urlencode, urlsplit


def quote_segment(value: str) -> str:
    """One URL path segment or query value for any id (``/``, ``%``, lone surrogates included)."""
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


def query_string(pairs: Iterable[tuple[str, str]]) -> str:
    """``a=1&b=x%2Fy`` from ``(name, value)`` pairs, empty values left out (any id, lone surrogates too)."""
    return urlencode([(k, v.encode("utf-8", "surrogatepass")) for k, v in pairs if v], quote_via=quote)


def with_query(path: str, pairs: Iterable[tuple[str, str]]) -> str:
    """``path`` with the pairs added to its query (``path`` may have one already)."""
    query = query_string(pairs)
    if not query:
        return path
    return path + ("&" if "?" in path else "?") + query


def session_path(sid: str, instance: str | None = None, suffix: str = "") -> str:
    """The stable path of a session's page (``/sessions/{id}``), optionally of one archive; unprefixed.

    The ids ``.`` and ``..`` cannot be a path segment (browsers and clients resolve them, even as
    ``%2E``): those two get the query form ``/session?id=..`` instead, which is served the same.
    """
    if sid.strip(".") == "":
        return with_query(f"/session{suffix}", [("id", sid), ("instance", instance or "")])
    return with_query(f"/sessions/{quote_segment(sid)}{suffix}", [("instance", instance or "")])


def normalise_prefix(value: str) -> str:
    """A route prefix as a path: ``""`` for the root, else ``/a/b`` (one leading slash, none trailing).

    ``ValueError`` for anything but a plain path (a query, a fragment, ``.``/``..`` segments,
    characters a URL path cannot hold as they are).
    """
    text = value.strip()
    if any(ch in text for ch in "?#\\") or any(ord(ch) <= 0x20 or ord(ch) == 0x7F for ch in text):
        raise ValueError(f"expected a URL path such as /evidence, got {value!r}")
    segments = [s for s in text.split("/") if s]
    if any(s in (".", "..") for s in segments):
        raise ValueError(f"a route prefix cannot contain . or .. segments: {value!r}")
    return "".join("/" + s for s in segments)


@dataclass(frozen=True, slots=True)
class Mount:
    """Where the browser lives: the path it answers under (``route``) and the path its links start with."""

    route: str = ""
    links: str = ""

    def link(self, path: str) -> str:
        """A page's path (``/sessions…``) as a link from any page."""
        return self.links + path

    def session(self, sid: str, instance: str | None = None, suffix: str = "") -> str:
        """The link to a session's page (or its ``/logs``, ``/items/N``); see :func:`session_path`."""
        return self.links + session_path(sid, instance, suffix)

    def strip(self, path: str) -> str | None:
        """The request path below the route prefix (``/`` at least); ``None`` when outside it."""
        if not self.route:
            return path
        if path == self.route:
            return "/"
        if path.startswith(self.route + "/"):
            return path[len(self.route) :]
        return None


def mount(external_url: str | None = None, route_prefix: str | None = None) -> Mount:
    """The mount from ``--web.external-url`` and ``--web.route-prefix``; ``ValueError`` naming the bad one.

    The external URL must be absolute (``http(s)://host[:port][/path]``); its path prefixes every
    link and is the route prefix unless one is given.
    """
    links = ""
    if external_url:
        parts = urlsplit(external_url.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
            raise ValueError(
                f"--web.external-url: expected an absolute URL such as https://tools.example.com/evidence, "
                f"got {external_url!r}"
            )
        try:
            links = normalise_prefix(parts.path)
        except ValueError as exc:
            raise ValueError(f"--web.external-url: {exc}") from None
    route = links
    if route_prefix is not None:
        try:
            route = normalise_prefix(route_prefix)
        except ValueError as exc:
            raise ValueError(f"--web.route-prefix: {exc}") from None
        if not external_url:
            links = route
    return Mount(route, links)
