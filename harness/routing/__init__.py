"""Generated routing: named knobs (params.py), a generator (generate.py), a fit of the knobs
to any trace (fit.py) and its command (`python -m harness.routing`); docs/routing-regimes.md."""
