"""The regime map: every policy's verdict over generated routing regimes (docs/routing-regimes.md)."""
