"""What runs over recorded routing: replay in batch, temporal stability and routing
statistics (the trace format itself is harness/placement/trace.py; the cached recordings
every run shares are harness/job/artifacts.py).

  batch_replay.py   replay in batch for systems with a batch planner (fiddler, tide)
  stability.py      temporal stability of routing within blocks
  routing_stats.py  how concentrated a trace's routing is (per step and over the run)
  locality.py       token-level statistics: temporal locality, LRU hit rate, prefill vs decode
  importing.py      routing recorded elsewhere checked and turned into a trace (docs/real-routing.md),
                    read by vllm_format.py, ids_format.py and jsonl_format.py; export.py the reverse
  holdout.py        a trace's last requests held out as the calibration
  __main__.py       python -m harness.traces import | export | stats
"""
