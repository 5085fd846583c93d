"""Trained proxies: the stdlib corpus, the masked-diffusion objective, aux-loss-free expert
balancing, the training loop and the cache of trained checkpoints (docs/proxies.md)."""
