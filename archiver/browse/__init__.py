"""The evidence browser (`archiver browse`): read-only web pages over the archive for people without a terminal.

``app`` turns a request path into a response from the store (through ``archiver.retrieve``), with
``listing`` (the list's filters and pages), ``search`` (log search on the grep engine), ``views``
(how archived data reads on a page), ``params`` (query strings) and ``urls`` (the mount and every
link); ``server`` serves it over HTTP with the daemon's web config (TLS, bcrypt basic auth).
"""
