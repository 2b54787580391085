"""The upstream room: the session-hosting service's HTTP API as seen from here (client, payloads, its /metrics)."""
