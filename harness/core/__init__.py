"""Placement and accounting, without the model's numerics: the engine that holds residency and
checks every system's plan, the ledger that charges it, and the cost model, budget and GPU
topology it charges with.

  engine.py        residency per MoE layer, plan validation, decide/account into the ledger
  plan_rules.py    the rules every plan must keep (PlanError)
  ledger.py        counters, the per-forward timeline and the step series, charged in batches of forwards
  breakdown.py     the modeled time per forward split by component, per phase and by window length
  ordered_sums.py  float sums in the order the accounts define them
  pipeline.py      Mixtral-Offload's pipelined misses: the layer time rule the ledger charges
  bitsets.py       expert sets packed as bits, for batch planners
  cost.py          hardware profiles and the latency model
  profiling.py     `hardware=local` and `hardware.file`: this machine measured for the cost model
                   (`python -m harness.profile`, harness/profile.py, writes a profile YAML)
  budget.py        GPU memory budget -> B experts per layer (scope per_layer | global)
  topology.py      one GPU, or several of unequal speed sharing the experts (expert parallelism)
"""
