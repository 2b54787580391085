"""Whether the store answers, enforces create-once writes and keeps the other guarantees the
archiver relies on, as the archive pipeline reports it."""

from __future__ import annotations

import logging

from archiver.errors import StoreError
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.store import S3Store
from archiver.store.base import ObjectStore

log = logging.getLogger("archiver.daemon")  # the name these lines had when the daemon owned them

#: Read by the periodic health check; never written (a missing key is a healthy answer).
HEALTH_KEY = "_probe/health"


def probe_store(store: ObjectStore, metrics: SelfMetrics) -> bool:
    """Does the store refuse a second create-once write? (Some S3-compatible servers ignore
    If-None-Match; the store then keeps checking before each write.) False when the store did
    not answer; the result is reported in `archiver_store_conditional_writes_supported`, and what
    an S3 store keeps of every other guarantee in `archiver_store_guarantee` (the probe logs one
    warning per guarantee missing)."""
    try:
        supported = store.probe_conditional_writes()
    except StoreError as exc:
        log.warning("store probe failed: %s", exc)
        metrics.set_store_up(False)
        return False
    metrics.set_conditional_writes_supported(supported)
    if isinstance(store, S3Store):
        metrics.set_store_guarantees(store.guarantees_held())
    metrics.set_store_up(True)
    return True


def check_store(store: ObjectStore, metrics: SelfMetrics) -> bool:
    """One cheap read of the store (HEAD of a key that need not exist) → `archiver_store_up`."""
    try:
        store.head(store.prefix + HEALTH_KEY)
    except StoreError as exc:
        log.warning("store health check failed: %s", exc)
        metrics.set_store_up(False)
        return False
    metrics.set_store_up(True)
    return True
