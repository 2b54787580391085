"""The archive room: detecting ended sessions and carrying their logs and artifacts into the store before removal."""
