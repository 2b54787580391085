"""The metrics hub: the daemon's own `archiver_*` metrics and the process's, which every feature room may report to."""
