"""rayspec.server."""
