"""Transformers MoE families (docs/model-families.md): the bridge at transformers' experts interface
(bridge.py), one adapter per family (adapter.py, diffusiongemma.py, registry.py), their
published geometry (geometry.py, configs/*.json), proxies (proxies.py) and checkpoint
loading (loading.py).

Below the placement interface: nothing here imports the engine or its callers (only
harness.common.errors, harness.common.files and transformers). Each family's entry (its
config, its decode driver, its capabilities) lives in harness/zoo (families.py, ar_generate.py,
diffusiongemma_generate.py)."""
