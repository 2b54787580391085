"""Live capture of running sessions' logs: follow streams, a durable per-session capture, and what to follow.

The room's pure decisions (`lines`, `resume`, `followset`, `policy`) take plain data; its I/O
boundaries are `stream` (one HTTP/1.1 follow stream on asyncio), `store` (capture files and their
checkpoints) and `engine` (the event loop thread that runs them).
"""
