"""What a plan costs: the hardware profiles and latency model, the budget in experts per
layer, the GPU topology, and the ledger that charges every layer's outcome on one forward
timeline (docs/cost-model.md).

  cost.py           hardware profiles and the roofline latency model
  profiling.py      this machine measured for the cost model (hardware=local, hardware.file;
                    python -m harness.profile writes a profile YAML)
  budget.py         GPU memory -> experts per layer (scope per_layer | global)
  topology.py       multi-GPU speed profiles and the expert-parallel layer cost
  ledger.py         counters, the forward timeline and the step series, charged in batches
  charge.py         the charge rule: outcomes prepared (cost-free), charged under a cost table,
                    added to the counters (the ledger and sensitivity's re-charge both use it)
  outcomes.py       a batch's placement outcomes, and a recorder that keeps them to charge again
  breakdown.py      the modeled time per forward split by component, per phase and by window length
  clock.py          the forward clock the ledger charges (compiled)
  tallies.py        per-layer pairs, misses and experts per side (compiled)
  pipeline.py       Mixtral-Offload's pipelined misses: the layer time rule
  ordered_sums.py   float sums in the order the accounts define them
  counting_sort.py  the heaviest-first order of a layer's experts (compiled)
  bitsets.py        packed expert sets for batch planners
"""
