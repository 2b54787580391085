"""session-archiver: Prometheus exporter and forensic archiver for a game-server session hosting service."""

from importlib.metadata import PackageNotFoundError, version

try:
    # The version lives in one place, pyproject.toml; the installed distribution's metadata carries it.
    __version__ = version("session-archiver")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
