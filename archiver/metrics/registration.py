"""Registering metric families on one registry: each declared in one line of name and labels, its help
text from its module's table; and the optional gauge, absent until set."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class OptionalGauge(Collector):
    """A label-less gauge that is absent until set, and again once set to None (a prometheus_client
    Gauge starts at 0 and cannot be absent; an absent series is what lets an alert say "nothing
    pending" rather than compare against a sentinel value)."""

    def __init__(self, name: str, documentation: str) -> None:
        self._name = name
        self._documentation = documentation
        self._lock = threading.Lock()
        self._value: float | None = None

    def set(self, value: float | None) -> None:
        with self._lock:
            self._value = value

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            value = self._value
        if value is not None:
            yield GaugeMetricFamily(self._name, self._documentation, value=value)

    def describe(self) -> Iterable[Metric]:
        # Describing lets the registry reject a second collector that registers the same name.
        return [GaugeMetricFamily(self._name, self._documentation)]


class Families:
    """Registers families on `registry`, each with its help text from `texts` (name → text). A
    scrape lists them in the order they are made."""

    def __init__(self, registry: CollectorRegistry, texts: Mapping[str, str]) -> None:
        self._registry = registry
        self._help = texts

    def counter(self, name: str, *labels: str) -> Counter:
        return Counter(name, self._help[name], labels, registry=self._registry)

    def gauge(self, name: str, *labels: str) -> Gauge:
        return Gauge(name, self._help[name], labels, registry=self._registry)

    def histogram(self, name: str, buckets: tuple[float, ...], *labels: str) -> Histogram:
        return Histogram(name, self._help[name], labels, buckets=buckets, registry=self._registry)

    def optional_gauge(self, name: str) -> OptionalGauge:
        gauge = OptionalGauge(name, self._help[name])
        self._registry.register(gauge)
        return gauge
