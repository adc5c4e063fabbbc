"""rayspec.twin."""
