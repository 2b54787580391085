"""The web room: the HTTP server (threads, TLS, basic auth) and the web config the exporter and the browser share."""
