"""The placement interface: what a system sees and what it answers (docs/systems.md).
Everything above implements or calls it; it imports only the model layer and below.

  steps.py    StepInfo: the identity of one model forward (prompt, block, step, kind)
  plan.py     LayerPlan: one layer's answer (GPU/CPU sides, fetches, evictions, prefetches)
  system.py   System, PrepareContext, and the protocols a system may read (costs, GPUs, geometry)
  trace.py    RoutingTrace: loads per forward and layer, in memory and on disk
"""
