"""The model side of a live run: prompts, the common block-diffusion decoding loop, decoding a
batch of prompts with an engine on the MoE layers, a loaded model ready to decode (loaded by
its entry, harness/zoo), and the lossless check.

  decoding.py      the common block-diffusion decoding loop (knows nothing of placement)
  decode_batch.py  decoding a list of prompts, with or without an engine on the MoE layers
  workload.py      prompts: built-in sets, a JSON-lines file or a bundled benchmark
  loading.py       a loaded model (LoadedModel) with its entry's decode driver and engine hook-up
  lossless.py      token comparison with the cached gpu_only reference
"""
