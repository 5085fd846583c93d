"""Real hybrid execution (`backend=cuda`): resident experts in per-layer GPU slot pools,
host experts in pinned memory, missed experts on the CPU in a worker thread, weight
copies on their own stream ordered with events, measured timing. The same code runs in
tests with a CPU stand-in for the device (device.StandInRuntime). Wiring it into a run
is harness/job/execution.py and harness/job/hybrid_setup.py (docs/gpu.md).

  backend.py   backend=auto|cpu|cuda|standin: resolution and the one-line error
  device.py    the device surface: CudaRuntime (streams, events) and StandInRuntime
  attach.py    attach a model to a device (non-experts there, experts pinned on the host)
  pool.py      per-layer slot pools (the budget, for real) and one-use scratch buffers
  executor.py  HybridExecutor: carries out an OffloadEngine's plans layer by layer
"""
