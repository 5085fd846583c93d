"""unit tests (docs/testing.md)."""
