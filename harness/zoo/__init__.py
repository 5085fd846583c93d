"""The models: one entry per kind of model (as torchtitan's ModelSpec bundles a model), and
the registry every name list, config node and kind-dependent check is built from.

  entry.py                    ModelEntry, its capabilities, the registry, the `model` config node
  llada2.py                   the LLaDA2 entry (tiny, mini, flash): this project's own model code
  families.py                 the transformers family entries, one per family
  ar_generate.py              the autoregressive families' decode driver (transformers' generate)
  diffusiongemma_generate.py  DiffusionGemma's decode driver (its own generate and sampler)

Between harness/decode (the loop, which calls an entry's driver through `LoadedModel`) and
the packages above, which ask the entries (docs/architecture.md). Adding a family is its
config JSON and its entry (docs/adding-a-model-family.md).
"""

from __future__ import annotations

from harness.zoo.entry import ModelEntry, register
from harness.zoo.families import FAMILIES
from harness.zoo.llada2 import LLADA2

# The built-in entries, in the order `model=` lists their models.
ENTRIES: tuple[ModelEntry, ...] = (LLADA2, *FAMILIES)
for _entry in ENTRIES:
    register(_entry)
