"""rayspec.bench."""
