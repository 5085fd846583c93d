"""Expert-placement policies, one file each. `registry.SYSTEMS` maps names to classes."""
