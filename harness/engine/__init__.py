"""The offload engine: residency per MoE layer, the rules every plan keeps, and
decide/account of each layer into the ledger (docs/architecture.md).

  engine.py      OffloadEngine: decide (ask the system, check, move residency) and account
  plan_rules.py  the rules every plan must keep (PlanError), one compiled pass per layer
"""
