"""session-archiver: Prometheus exporter and forensic archiver for a game-server session hosting service."""

__version__ = "0.1.0"
