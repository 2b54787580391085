"""The transparency log's ``archiver_log_*`` metrics (archiver/archive/log_stage.py reports them)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from archiver.metrics.registration import Families

#: The help text of each family, in the order a scrape lists them.
_HELP = {
    "archiver_log_leaves": "Archives this daemon appended to its transparency log.",
    "archiver_log_size": "Leaves in this daemon's transparency log, as of its last checkpoint.",
    "archiver_log_pending": "Archives committed (manifest written) and not yet in the transparency log.",
    "archiver_log_last_checkpoint_timestamp_seconds": (
        "When this daemon last signed a checkpoint of its log (Unix time; 0 before the first)."
    ),
    "archiver_log_consistency_ok": (
        "1 while the stored log is consistent with every checkpoint this daemon signed or kept, 0 once not "
        "(tampering, a rollback, another writer of the same log): appending stops."
    ),
}


class LogMetrics:
    """Leaves appended, tree size, archives waiting, last checkpoint time, consistency."""

    def __init__(self, registry: CollectorRegistry) -> None:
        family = Families(registry, _HELP)
        self.leaves = family.counter("archiver_log_leaves")
        self.size = family.gauge("archiver_log_size")
        self.pending = family.gauge("archiver_log_pending")
        self.last_checkpoint = family.gauge("archiver_log_last_checkpoint_timestamp_seconds")
        self.consistency = family.gauge("archiver_log_consistency_ok")
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
