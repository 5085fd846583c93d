"""The bottom layer: the one exception type for bad input and the file helpers every layer
uses (docs/architecture.md has the layers).

  errors.py   HarnessError (one line, exit 2), argparse that raises it, output-dir checks
  files.py    atomic writes (temp file, fsync, rename), JSON reading, stable fingerprints
  checks.py   the small checks typed config parts share (require, given)
  interrupts.py  Ctrl-C recorded as well as raised, so code that swallows it cannot hide it
"""
