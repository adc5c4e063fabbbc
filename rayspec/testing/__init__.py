"""rayspec.testing."""
