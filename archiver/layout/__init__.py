"""The layout room: where archived objects live in a store (keys) and what describes them (manifest, index)."""
