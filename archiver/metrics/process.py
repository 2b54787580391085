"""The process's own families, `process_*` (RSS, CPU, open files, start time) and `python_*` (build,
garbage collector): prometheus_client's collectors, on a registry of ours rather than its global one."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder


def register_process_collectors(registry: CollectorRegistry) -> CollectorRegistry:
    """Adds the process_* (read from /proc: Linux only, absent elsewhere), python_info and
    python_gc_* families to `registry`; returns it."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """The registry's exposition in the format `accept` asks for (OpenMetrics or text), and its content type."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type
