"""The evidence browser (`archiver browse`): read-only web pages over the archive for people without a terminal.

``app`` turns a request path into a response from the store (through ``archiver.retrieve``);
``server`` serves it over HTTP with the daemon's web config (TLS, bcrypt basic auth).
"""
