"""integration tests (docs/testing.md)."""
