"""Lenient parsing of the upstream's `/metrics` text into a small, immutable metric-family model."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.exposition import generate_latest as _text_generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as _om_generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

from archiver.errors import PayloadError, upstream_excerpt

#: Longest upstream body we accept: the real service sends a handful of lines; anything this large is
#: a misrouted response (an HTML page, a log) and would bloat every snapshot.
MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class UpstreamSample:
    """One sample line; the upstream's timestamp and exemplar are deliberately dropped (see render)."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(frozen=True, slots=True)
class MetricFamily:
    """One upstream metric family, as prometheus_client's parser understood it.

    `type` uses OpenMetrics names (`counter`, `gauge`, `histogram`, `summary`, `unknown`, ...); a line
    without a `# TYPE` (the real service's `session_count 3`) is `unknown`. Counter samples already
    carry the `_total` suffix (the parser adds it when the upstream left it off).
    """

    name: str
    type: str
    help: str
    samples: tuple[UpstreamSample, ...]


def parse_upstream_metrics(body: bytes | str) -> list[MetricFamily]:
    """Parse a Prometheus text (0.0.4) body; anything unparsable raises PayloadError.

    The families are also trial-rendered in both exposition formats here, so a body that parses but
    cannot be re-exposed (e.g. clashing names) fails the poll instead of the render.
    """
    if isinstance(body, bytes):
        if len(body) > MAX_BODY_BYTES:
            raise PayloadError(f"metrics body is {len(body)} bytes, more than {MAX_BODY_BYTES}")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise PayloadError("metrics body is not UTF-8") from None
    else:
        if len(body) > MAX_BODY_BYTES:  # characters, at least one byte each
            raise PayloadError(f"metrics body is more than {MAX_BODY_BYTES} bytes")
        text = body
    try:
        families = [_convert(metric) for metric in text_string_to_metric_families(text)]
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        # The parser raises bare ValueErrors (and the odd IndexError on truncated lines); the message
        # may quote the line, so only a short excerpt of the body goes into ours.
        what = exc.__class__.__name__
        raise PayloadError(
            f"metrics body is not Prometheus text ({what}; body starts: {upstream_excerpt(text, 80)!r})"
        ) from None
    try:
        render_upstream(families, prefix="x_", openmetrics=False)
        render_upstream(families, prefix="x_", openmetrics=True)
    except (ValueError, TypeError, KeyError) as exc:
        raise PayloadError(f"metrics body cannot be re-exposed ({exc})") from None
    return families


def _convert(metric: Metric) -> MetricFamily:
    samples = tuple(
        UpstreamSample(sample.name, tuple(sorted(sample.labels.items())), float(sample.value))
        for sample in metric.samples
    )
    return MetricFamily(name=metric.name, type=metric.type, help=metric.documentation, samples=samples)


class _FamiliesCollector(Collector):
    """Feeds already-parsed families to prometheus_client's exposition functions under a prefix."""

    def __init__(self, families: Sequence[MetricFamily], prefix: str) -> None:
        self._families = families
        self._prefix = prefix

    def collect(self) -> Iterator[Metric]:
        prefix = self._prefix
        for family in self._families:
            # An empty HELP is legal, but promtool flags it; say where the family comes from instead.
            doc = family.help or f"Upstream metric {family.name}, re-exposed by session-archiver."
            metric = Metric(prefix + family.name, doc, family.type)
            for sample in family.samples:
                metric.add_sample(prefix + sample.name, dict(sample.labels), sample.value)
            yield metric


def render_upstream(families: Sequence[MetricFamily], *, prefix: str, openmetrics: bool) -> bytes:
    """Render the families with every name prefixed, WITHOUT the OpenMetrics `# EOF` line.

    The families are few, so prometheus_client's own writers (which know each format's type names and
    `_total`/`_created` rules) are fast enough and cannot get the formats subtly wrong. Timestamps are
    not re-exposed: a timestamped sample would switch off Prometheus' staleness handling for a series
    that we already serve at most one poll interval old.
    """
    if not families:
        return b""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_FamiliesCollector(families, prefix))
    if openmetrics:
        # prometheus_client's OpenMetrics writer has no annotations.
        body: bytes = _om_generate_latest(registry)  # type: ignore[no-untyped-call]
        return body[: -len(b"# EOF\n")] if body.endswith(b"# EOF\n") else body
    return _text_generate_latest(registry)
