"""Routing traces and what runs over them: the trace format, the cached gpu_only recordings
every run shares, replay in batch, and the temporal stability of routing.

  trace.py         routing traces in memory and on disk; derived no-cache traces
  artifacts.py     cached calibration and workload traces and reference tokens; code digests
  batch_replay.py  replay in batch for systems with a batch planner (fiddler, tide)
  stability.py     temporal stability of routing within blocks
"""
