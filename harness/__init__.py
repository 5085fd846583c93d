"""Benchmarking harness for expert offloading in MoE diffusion language models."""

__version__ = "0.1.0"
