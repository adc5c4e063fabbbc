"""rayspec.search."""
