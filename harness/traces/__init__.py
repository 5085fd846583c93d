"""What runs over recorded routing: replay in batch, temporal stability and routing
statistics (the trace format itself is harness/placement/trace.py; the cached recordings
every run shares are harness/job/artifacts.py).

  batch_replay.py   replay in batch for systems with a batch planner (fiddler, tide)
  stability.py      temporal stability of routing within blocks
  routing_stats.py  how concentrated a trace's routing is (per step and over the run)
"""
