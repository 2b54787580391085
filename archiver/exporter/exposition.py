"""Pre-rendered Prometheus exposition of a poll: per-session lines cached, body built and gzipped once.

The scrape path never renders: it writes the byte strings of the last `Snapshot` followed by the small
self-metrics tail (see `scrape_parts`). Rendering follows kube-state-metrics: every session's sample
lines are rendered once and cached next to a cheap change key, so a poll only re-renders the sessions
that are new or changed; the families' bytes are kept in blocks of sessions (`blocks.SessionBlocks`)
whose joined and compressed parts are reused until one of their sessions changes. Which families
exist, their help, labels and line renderers are one declarative table (`families.FAMILIES`);
the aggregates are `aggregates.Aggregator`'s.

Format notes (both formats are served from the same bytes wherever possible):
- Every family rendered here is a gauge; gauge sample lines are identical in text 0.0.4 and
  OpenMetrics 1.0.0, so the session block is rendered and gzipped once and shared by both formats.
  Only the small upstream block differs per format (TYPE names, counter `_total` rules).
- Nothing here writes `# EOF`: the self metrics are appended at scrape time and end the body.
- Upstream families keep their type: the real service's untyped `session_count 3` stays `untyped`
  in text 0.0.4 (`unknown` in OpenMetrics), which Prometheus stores like a gauge, so
  `sessionhost_upstream_session_count` is queried as is; guessing `gauge` could be wrong for others.
- A gzip response is ONE gzip member stitched from pieces (as pigz joins its parallel blocks): each
  precompressed part is a self-contained raw deflate segment (no reference to bytes before it,
  ended by a sync or full flush: byte-aligned, not final), the
  per-scrape tail is compressed as the final blocks, and the CRC-32 trailer continues the snapshot's
  precomputed CRC over the tail. Multi-member gzip would be simpler but is not safe: httpx (and
  other zlib-based clients) silently stop after the first member.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Mapping, Sequence

from archiver.errors import ConfigError
from archiver.exporter.aggregates import Aggregates, Aggregator
from archiver.exporter.blocks import BLOCK_SESSIONS, SessionBlocks, coalesce, combine_crc
from archiver.exporter.families import (
    AGGREGATE_FAMILIES,
    DEFAULT_PREFIX,
    SESSION_FAMILIES,
    SNAPSHOT_FAMILIES,
    encode,
    escape_label_value,
    label_names_for,
)
from archiver.exporter.snapshot import (
    Snapshot,
    crc32,
    deflate_segment,
)
from archiver.upstream.metrics import MetricFamily, render_upstream
from archiver.upstream.models import ListDelta, Session


class _Entry:
    """The cached sample lines of one exported session (one per active per-session family), with
    the key they were rendered from."""

    __slots__ = ("key", "lines")

    def __init__(self, key: tuple[object, ...], lines: tuple[bytes, ...]) -> None:
        self.key = key
        self.lines = lines


#: The rendered fields of a session (the change key, with the allowlisted label values appended).
_KEY_FIELD_NAMES: tuple[str, ...] = tuple(
    dict.fromkeys(field for family in SESSION_FAMILIES for field in family.fields)
)
_KEY_FIELDS: Callable[[Session], tuple[object, ...]] = operator.attrgetter(*_KEY_FIELD_NAMES)
_ID: Callable[[Session], str] = operator.attrgetter("id")


def _order_key(session: Session) -> tuple[float, str]:
    created = session.created_ms
    # NaN would make the sort order undefined; such a session sorts last.
    return (created if created == created else math.inf, session.id)


def _touched(previous: Mapping[str, Session], current: Mapping[str, Session]) -> list[tuple[str, Session]]:
    """The (id, session) pairs of `current` that are not the very object `previous` holds for that id:
    new and changed sessions. A parser that reuses unchanged Session objects (SessionListParser)
    makes them a few percent; the scan itself runs in C (map/compress), not a Python loop."""
    same = map(operator.is_, map(previous.get, current), current.values())
    return list(itertools.compress(current.items(), map(operator.not_, same)))


class SnapshotRenderer:
    """Turns each poll's sessions and upstream families into a `Snapshot`, reusing unchanged work.

    Not thread-safe: one poller thread calls `render`; scrapes only read the returned immutable
    snapshots.

    The work of a poll follows what changed: new and changed sessions are found by identity in C,
    only they are rendered again and move the aggregates, and only the blocks holding them are joined
    and compressed again (`blocks.SessionBlocks`). Series come out in block order: a session keeps its
    place while it is exported, new ones are appended.

    Per-session series are capped at `max_sessions`: when there are more sessions, the oldest ones
    (smallest `created`, ties broken by id) are exported — a stable choice, so a series does not
    flap in and out between polls while the count stays above the cap. Aggregates always count
    every session.
    """

    def __init__(
        self,
        *,
        max_sessions: int,
        label_allowlist: Sequence[str],
        prefix: str = DEFAULT_PREFIX,
        block_sessions: int = BLOCK_SESSIONS,
    ) -> None:
        if max_sessions < 0:
            raise ConfigError(f"max-sessions must be 0 or more, got {max_sessions}")
        self._max_sessions = max_sessions
        self._prefix = prefix
        #: (label name, caller key) sorted by label name, so rendered labels come out sorted.
        self.label_names = label_names_for(label_allowlist)
        self._label_pairs = tuple(sorted((name, key) for key, name in self.label_names.items()))
        self._label_keys = tuple(key for _, key in self._label_pairs)
        # HELP/TYPE headers never change: built once. The labels family exists only with an allowlist.
        self._aggregate_families = tuple(
            (family.render, family.full_name(prefix), family.header(prefix)) for family in AGGREGATE_FAMILIES
        )
        self._session_families = tuple(
            (family.render, family.full_name(prefix), family.header(prefix))
            for family in SESSION_FAMILIES
            if self._label_pairs or not family.needs_allowlist
        )
        #: Per session family, the positions in the change key of what its lines are rendered from.
        self._family_key_indices = tuple(
            (
                *(_KEY_FIELD_NAMES.index(field) for field in family.fields),
                *(
                    range(len(_KEY_FIELD_NAMES), len(_KEY_FIELD_NAMES) + len(self._label_keys))
                    if family.needs_allowlist
                    else ()
                ),
            )
            for family in SESSION_FAMILIES
            if self._label_pairs or not family.needs_allowlist
        )
        #: Each session family's header as a part: raw, self-contained deflate, CRC-32.
        self._header_parts = tuple(
            (header, deflate_segment(header), crc32(header)) for _, _, header in self._session_families
        )
        self._snapshot_families = tuple(
            (
                family.value,
                family.header(prefix),
                family.full_name(prefix).encode(),
            )
            for family in SNAPSHOT_FAMILIES
        )
        self._block_sessions = block_sessions
        self._forget()
        self._last: Snapshot | None = None
        self._upstream: tuple[bytes, bytes, bytes, bytes] = (b"", b"", b"", b"")
        self._body: tuple[bytes, ...] = ()
        self._body_deflate: tuple[bytes, ...] = ()
        self._body_crc = 0
        self._body_length = 0
        #: How many session entries were (re-)rendered since construction; lets tests observe caching.
        self.render_count = 0

    def _forget(self) -> None:
        """Drop every incremental state (at construction, and after a render that failed half-way:
        the next poll then renders from scratch rather than trusting half-updated blocks)."""
        #: Every session of the last good poll (aggregates) and the exported ones with their entries.
        self._all: dict[str, Session] = {}
        self._exported: dict[str, Session] = self._all
        self._cache: dict[str, _Entry] = {}
        self._lines: dict[str, tuple[bytes, ...]] = {}
        self._blocks = SessionBlocks(len(self._session_families), block_sessions=self._block_sessions)
        self._aggregator = Aggregator()
        #: The list `_all` holds (every id once), which a parser's `ListDelta.base` must be.
        self._base: Sequence[Session] | None = None
        # What the last session block was built from, to skip the build when nothing changed.
        self._built = False
        self._last_aggregates: Aggregates = ({}, {})
        self._last_dropped = -1
        self._head: tuple[bytes, bytes, int] = (b"", b"", 0)

    @property
    def last(self) -> Snapshot | None:
        """The most recent snapshot, or None before the first render."""
        return self._last

    @property
    def parts_built(self) -> int:
        """How many block parts were compressed since construction; lets tests observe reuse."""
        return self._blocks.parts_built

    @property
    def block_count(self) -> int:
        return self._blocks.blocks

    def render(
        self,
        sessions: Sequence[Session] | None,
        upstream_families: list[MetricFamily] | None,
        *,
        now: float,
        delta: ListDelta | None = None,
    ) -> Snapshot:
        """Build the snapshot of a poll. `None` for either input means that half of the poll failed:
        its last rendering is kept. When both are None the previous snapshot is returned unchanged,
        so its `rendered_at` keeps saying how old the data is. `delta` (the parser's account of
        what changed since the list rendered last) spares comparing every session; it is used only
        when it links that list to `sessions` and agrees with what was rendered (`_apply_delta`)."""
        if sessions is None and upstream_families is None and self._last is not None:
            return self._last
        if upstream_families is not None:
            self._upstream = self._render_upstream(upstream_families)
        if sessions is not None:
            try:
                self._update_sessions(sessions, delta)
            except BaseException:
                # The last snapshot's bytes are immutable and stay served; the state behind them may
                # be half-updated, so it is dropped.
                self._forget()
                raise
        up_text, up_text_deflate, up_om, up_om_deflate = self._upstream
        self._last = Snapshot(
            sessions_body=self._body,
            sessions_deflate=self._body_deflate,
            upstream_text=up_text,
            upstream_text_deflate=up_text_deflate,
            upstream_openmetrics=up_om,
            upstream_openmetrics_deflate=up_om_deflate,
            # The upstream block is small: continuing the block's CRC over it costs nothing.
            crc_text=crc32(up_text, self._body_crc),
            crc_openmetrics=crc32(up_om, self._body_crc),
            rendered_at=now,
            sessions_exported=len(self._exported),
            sessions_dropped=max(self._last_dropped, 0),
            sessions_length=self._body_length,
        )
        return self._last

    def _render_upstream(self, families: Sequence[MetricFamily]) -> tuple[bytes, bytes, bytes, bytes]:
        prefix = self._prefix + "upstream_"
        text = render_upstream(families, prefix=prefix, openmetrics=False)
        om = render_upstream(families, prefix=prefix, openmetrics=True)
        return text, deflate_segment(text), om, deflate_segment(om)

    def _update_sessions(self, sessions: Sequence[Session], delta: ListDelta | None) -> None:
        changes = self._apply_delta(sessions, delta)
        if changes is None:
            # A duplicated id would be a duplicated series, which makes Prometheus reject the scrape
            # (the last entry of an id wins, at the place of its first, as a dict comprehension does).
            unique = dict(zip(map(_ID, sessions), sessions, strict=True))
            previous = self._all
            touched = _touched(previous, unique)
            gone = self._all.keys() - unique.keys()
            ended = [previous[sid] for sid in gone]
            ended += filter(None, map(previous.get, map(operator.itemgetter(0), touched)))
        else:
            unique, touched, gone, ended = changes
        if len(touched) + len(gone) > len(unique) // 4:
            self._aggregator.rebuild(unique.values())  # a first poll, or a big change: in C
        else:
            for session in ended:
                self._aggregator.remove(session)
            for _, session in touched:
                self._aggregator.add(session)

        exported = unique
        if len(unique) > self._max_sessions:
            chosen = sorted(unique.values(), key=_order_key)[: self._max_sessions]
            exported = dict(zip(map(_ID, chosen), chosen, strict=True))
        if exported is unique and self._exported is self._all:
            removed = list(gone)  # every session was exported last poll and is now: one diff serves both
        else:
            touched = _touched(self._exported, exported)
            removed = list(self._exported.keys() - exported.keys())
        dropped = len(unique) - len(exported)
        self._all, self._exported = unique, exported
        self._base = sessions if len(unique) == len(sessions) else None
        added, changed = self._update_entries(touched, removed)

        aggregates = self._aggregator.result()
        if (
            self._built
            and not (added or changed or removed)
            and aggregates == self._last_aggregates
            and dropped == self._last_dropped
        ):
            return  # nothing visible changed: keep the parts and their compressed forms
        self._built = True
        if aggregates != self._last_aggregates or not self._head[0]:
            self._head = self._aggregate_part(aggregates)
        self._last_aggregates = aggregates
        self._last_dropped = dropped
        self._blocks.update(removed=removed, added=added, changed=changed, lines_of=self._lines)
        self._blocks.build()
        self._assemble(len(exported), dropped)

    def _apply_delta(
        self, sessions: Sequence[Session], delta: ListDelta | None
    ) -> tuple[dict[str, Session], list[tuple[str, Session]], set[str], list[Session]] | None:
        """`_all` moved to `sessions` by the parser's delta, with what `_update_sessions` needs: the
        touched (id, session) pairs, the ids gone, the sessions that left the aggregates. None (and
        nothing changed) unless the delta applies: it must lead from the very list rendered last to
        `sessions`, every session it removes must be the one held for its id, every one it adds must
        take a free id, and the count must come out at `len(sessions)` (which also proves the ids
        unique). The per-session cap then takes the full path (it picks the exported sessions anew).

        The parser builds the delta from its own map of the previous list's entries (`ListDelta`), so
        it cannot describe another pair of lists; these checks guard the link, not the parser."""
        all_ = self._all
        if (
            delta is None
            or delta.current is not sessions
            or self._base is None
            or delta.base is not self._base
            or self._exported is not all_
            or len(sessions) > self._max_sessions
        ):
            return None
        removed, added = delta.removed, delta.added
        if not all(map(operator.is_, map(all_.get, map(_ID, removed)), removed)):
            return None
        removed_ids = set(map(_ID, removed))
        added_ids = list(map(_ID, added))
        if (
            len(removed_ids) != len(removed)
            or len(set(added_ids)) != len(added)
            or any(sid in all_ and sid not in removed_ids for sid in added_ids)
            or len(all_) - len(removed) + len(added) != len(sessions)
        ):
            return None
        for sid in removed_ids:
            del all_[sid]
        touched = list(zip(added_ids, added, strict=True))
        all_.update(touched)
        return all_, touched, removed_ids.difference(added_ids), list(removed)

    def _update_entries(
        self, touched: list[tuple[str, Session]], removed: list[str]
    ) -> tuple[list[str], dict[str, list[int]]]:
        """Render the new and changed exported sessions; returns the new ids and, per changed id,
        the families whose line changed. Only these sessions run Python code here."""
        cache, lines = self._cache, self._lines
        label_keys = self._label_keys
        added: list[str] = []
        changed: dict[str, list[int]] = {}
        for sid, session in touched:
            key: tuple[object, ...] = _KEY_FIELDS(session)
            if label_keys:
                key += tuple(map(session.labels.get, label_keys))
            entry = cache.get(sid)
            if entry is None:
                entry = cache[sid] = self._render_entry(session, key)
                lines[sid] = entry.lines
                added.append(sid)
            elif entry.key != key:
                new = cache[sid] = self._render_entry(session, key, entry)
                which = [n for n, (a, b) in enumerate(zip(new.lines, entry.lines, strict=True)) if a != b]
                lines[sid] = new.lines
                if which:
                    changed[sid] = which
            else:
                # Point at the current objects so the previous poll's strings can be freed.
                entry.key = key
        for sid in removed:  # ended (or no longer exported) sessions fall out of the cache
            del cache[sid], lines[sid]
        return added, changed

    def _render_entry(self, s: Session, key: tuple[object, ...], old: _Entry | None = None) -> _Entry:
        """The entry of a new session, or of a changed one (`old`): then only the families whose
        fields changed are rendered again (a new player count renders one line, not five)."""
        self.render_count += 1
        sid = f'session_id="{escape_label_value(s.id)}"'
        pairs = self._label_pairs
        if old is None:
            lines = tuple(encode(render(name, s, sid, pairs)) for render, name, _ in self._session_families)
            return _Entry(key, lines)
        before = old.key
        kept = list(old.lines)
        for n, (render, name, _) in enumerate(self._session_families):
            if any(key[i] != before[i] for i in self._family_key_indices[n]):
                kept[n] = encode(render(name, s, sid, pairs))
        return _Entry(key, tuple(kept))

    def _aggregate_part(self, aggregates: Aggregates) -> tuple[bytes, bytes, int]:
        raw = b"".join(header + encode(render(name, aggregates)) for render, name, header in self._aggregate_families)
        return raw, deflate_segment(raw), crc32(raw)

    def _assemble(self, exported: int, dropped: int) -> None:
        """The session block as parts: aggregates, each family's header and block parts, snapshot gauges."""
        tail = b"".join(
            header + b"%s %d\n" % (encoded_name, value(exported, dropped))
            for value, header, encoded_name in self._snapshot_families
        )
        head_raw, head_deflate, head_crc = self._head
        raw: list[bytes] = [head_raw]
        deflated: list[bytes] = [head_deflate]
        crcs: list[int] = [head_crc]
        for family, (header, header_deflate, header_crc) in enumerate(self._header_parts):
            parts, segments, part_crcs = self._blocks.family_parts(family)
            raw += (header, *parts)
            deflated += (header_deflate, *segments)
            crcs += (header_crc, *part_crcs)
        raw.append(tail)
        deflated.append(deflate_segment(tail))
        crcs.append(crc32(tail))
        self._body = tuple(part for part in raw if part)
        self._body_deflate = coalesce(deflated)
        self._body_crc = combine_crc(0, raw, crcs)
        self._body_length = sum(map(len, raw))
