"""The transparency log's ``archiver_log_*`` metrics (archiver/archive/log_stage.py reports them)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class LogMetrics:
    """Leaves appended, tree size, archives waiting, last checkpoint time, consistency."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.leaves = Counter(
            "archiver_log_leaves",
            "Archives this daemon appended to its transparency log.",
            registry=registry,
        )
        self.size = Gauge(
            "archiver_log_size",
            "Leaves in this daemon's transparency log, as of its last checkpoint.",
            registry=registry,
        )
        self.pending = Gauge(
            "archiver_log_pending",
            "Archives committed (manifest written) and not yet in the transparency log.",
            registry=registry,
        )
        self.last_checkpoint = Gauge(
            "archiver_log_last_checkpoint_timestamp_seconds",
            "When this daemon last signed a checkpoint of its log (Unix time; 0 before the first).",
            registry=registry,
        )
        self.consistency = Gauge(
            "archiver_log_consistency_ok",
            "1 while the stored log is consistent with every checkpoint this daemon signed or kept, 0 once not "
            "(tampering, a rollback, another writer of the same log): appending stops.",
            registry=registry,
        )
        # Without a log (or before its first check) nothing is inconsistent: an alert on 0 must not fire.
        self.consistency.set(1)

    def checkpoint(self, appended: int, size: int, now: float) -> None:
        """A checkpoint of ``size`` leaves was signed at ``now``, ``appended`` of them new."""
        self.leaves.inc(appended)
        self.size.set(size)
        self.last_checkpoint.set(now)

    def state(self, pending: int, consistent: bool) -> None:
        self.pending.set(pending)
        self.consistency.set(1 if consistent else 0)
