"""The exporter room: polling the upstream, re-exposing it as /metrics, the HTTP server and the daemon's own metrics."""
