"""The retrieval room: finding, reading, downloading and re-verifying archives (`archiver ls/show/logs/get/verify`)."""
