"""The processes the command line starts: the daemon, the demo, `archiver check`, and their logging."""
