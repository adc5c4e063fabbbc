"""rayspec.store."""
