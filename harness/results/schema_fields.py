"""What every field of result.json means: the tables docs/result-schema.md is generated from
(harness/results/schema.py renders them; tests/unit/test_result_schema.py fails when a dataclass
field or a metric has no entry here, or when the page is stale).

Each entry is (unit, meaning); unit "-" for text, flags and identifiers. Keys of a dataclass
table are its field names (checked against `dataclasses.fields`); METRICS holds every number
a run can put into `metrics`, by the section that reports it; METRIC_PATTERNS the families
named by a pattern (the routing statistics).
"""

from __future__ import annotations

from harness.zoo.entry import model_names

Entry = tuple[str, str]

RESULT_FIELDS: dict[str, Entry] = {  # RunResult: result.json's sections (JSON key = field name unless noted)
    "identity": ("-", "what ran, on what and how: the top-level strings below (written flat, not as an object)"),
    "config": ("-", "the resolved run config (HarnessConfig as plain data); its keys are the command line's"),
    "budget": ("-", "the resolved GPU memory budget: the `budget` record below"),
    "metrics": ("-", "every number of every section in one flat object: the metrics table below"),
    "system_report": ("-", "the system's own report (its numbers are also in `metrics`; curves and lists only here)"),
    "lossless": ("-", "live runs: the token comparison with the gpu_only reference (its numbers are in `metrics`; "
                      "`metric_sections.lossless` names them); empty for replays"),
    "timing": ("-", "`timing` is the kind (modeled | measured | wall); `metric_sections.timing` names the clock "
                    "figures in `metrics`"),
    "versions": ("-", "software versions and the machine: the `versions` record below"),
    "step_series": ("-", "one point per forward: the `step_series` record below"),
    "decoded": ("-", "live runs: `outputs`, `steps` and `first_text` (written flat)"),
    "workload": ("-", "the prompts decoded: the `workload` record below (MLflow's dataset input)"),
    "routing": ("-", "with trace.record=true, and replays of an imported or generated trace: routing statistics "
                     "of the run's trace and their values under uniform routing (harness/traces/routing_stats.py); "
                     "generated: also `regime` (name, knobs, seed)"),
    "run_dir": ("-", "not written: the directory a result was read from or written to (harness.run sets it)"),
    "started_at": ("s (unix time)", "when the job started (before the model or trace was loaded)"),
    "finished_at": ("s (unix time)", "when its result was complete (just before result.json was written)"),
    "cost_breakdown": ("s (modeled)", "the modeled time per forward split into attention, other non-expert work, "
                                      "GPU experts, exposed copies and exposed CPU experts; per phase and by window "
                                      "length (harness/accounting/breakdown.py)"),
    "hardware_estimates": ("-", "the hardware profile's constants whose source is an estimate, with that source "
                                "(conf/hardware, docs/hardware-profiles.md)"),
    "schema": ("-", "the result schema's version (harness/results/run_result.py SCHEMA)"),
}

IDENTITY_FIELDS: dict[str, Entry] = {  # RunIdentity: top-level strings
    "system": ("-", "the placement system (systems/registry.py)"),
    "model": ("-", f"the model config: {' | '.join(model_names())} (harness/zoo)"),
    "weights": ("-", "real | trained-proxy | random-proxy (results before trained proxies: proxy)"),
    "checkpoint": ("-", "the checkpoint directory loaded (a proxy's path in the cache)"),
    "source": ("-", "live (decoded with the model) | trace (replayed over a routing trace)"),
    "hardware": ("-", "the hardware profile the cost model charged (conf/hardware)"),
    "decode_cache": ("-", "prefix (finished blocks' keys and values cached) | none"),
    "backend": ("-", "live runs: where the experts ran: cpu | cuda | standin"),
    "trace": ("-", "replays: the trace file"),
    "replay": ("-", "replays: how the trace was replayed (batch | layer by layer)"),
    "trace_derived_from": ("-", "replays of a no-cache trace derived from a prefix-cached recording: that recording"),
    "calibration": ("-", "replays: the calibration trace file the system learned from (null: none), or the trace's "
                         "held-out requests (calibration.from_workload with an explicit trace.path)"),
    "routing_source": ("-", "replays of routing not recorded by this harness: imported (python -m harness.traces "
                            "import, docs/real-routing.md) | generated (routing=<regime>, its name, knobs and seed "
                            "under routing.regime; docs/routing-regimes.md); absent: recorded by this harness"),
    "hints": ("-", "replays, systems that read next-layer hints: recorded | next_layer_loads (an import's perfect "
                   "predictor) | none (no hints in the trace: the prefetch predicts nothing)"),
}

TIMING_FIELDS: dict[str, Entry] = {
    "kind": ("-", "how tokens_per_s was obtained: modeled (cost model) | measured (a GPU's clock) | wall"),
    "figures": ("-", "the clock figures (metrics table, section timing), also in `metrics`"),
}

DECODED_FIELDS: dict[str, Entry] = {
    "outputs": ("-", "per prompt: prompt_tokens, tokens (the gen_length generated ids), n_generated (ids before "
                     "the first EOS, EOS included), stopped_at_eos"),
    "steps": ("-", "per forward: the `steps` record below"),
    "first_text": ("-", "the first prompt's decoded text"),
}

BUDGET_FIELDS: dict[str, Entry] = {  # harness/accounting/budget.py Budget
    "name": ("-", "the budget config: 10GB | 18GB | 30GB | 55GB | custom"),
    "gpu_gb": ("GB (1e9 bytes)", "the GPU memory budget"),
    "reserve_gb": ("GB", "memory held back for activations and the runtime"),
    "experts_per_layer": ("experts", "B, the experts per MoE layer the GPU holds in this run"),
    "derived_experts_per_layer": ("experts", "B from the formula floor((budget - non-expert - reserve) / "
                                             "(MoE layers x expert bytes)), capped"),
    "pinned": ("-", "true when the budget config pins B (the paper's settings)"),
    "fits_model": ("-", "every expert of every layer fits: nothing needs offloading"),
    "over_budget": ("-", "a pinned B whose experts need more than gpu_gb"),
    "non_expert_gb": ("GB", "attention, embeddings, dense layer and shared experts, bf16"),
    "expert_mb": ("MB (1e6 bytes)", "one routed expert, bf16"),
    "used_gb": ("GB", "non-expert + reserve + B experts in every MoE layer"),
    "scope": ("-", "per_layer | global (written only when global)"),
}

STEP_FIELDS: dict[str, Entry] = {  # harness/decode/decoding.py ForwardRecord: `steps`
    "prompt": ("index", "the prompt (0-based)"),
    "block": ("index", "the block of the sequence (position // block_length)"),
    "step": ("index", "the denoising step within the block"),
    "kind": ("-", "prefill | denoise | commit"),
    "tokens_routed": ("tokens", "tokens in the forward's window, each routed through every MoE layer"),
    "tokens_unmasked": ("tokens", "tokens this forward decided"),
}

STEP_SERIES_FIELDS: dict[str, Entry] = {  # harness/accounting/ledger.py: one point per forward
    "global_step": ("index", "the forward's number in the run (MLflow's step)"),
    "prompt": ("index", "the prompt it belongs to"),
    "kind": ("-", "prefill | denoise | commit"),
    "block": ("index", "the block"),
    "step": ("index", "the denoising step within the block"),
    "routed_pairs": ("(token, expert) pairs", "routed pairs of the forward, over all MoE layers"),
    "missed_pairs": ("(token, expert) pairs", "routed pairs whose expert was not resident"),
    "miss_rate": ("fraction", "missed_pairs / routed_pairs"),
    "modeled_latency_s": ("s (modeled)", "the forward's time under the cost model"),
}

WORKLOAD_FIELDS: dict[str, Entry] = {  # harness/decode/workload.py workload_record
    "name": ("-", "the workload config (coding, humaneval, jsonl, ...)"),
    "digest": ("-", "16 hex digits of the prompts actually decoded (after limit_prompts)"),
    "prompts": ("prompts", "how many were decoded"),
    "source_type": ("-", "code (built in or packaged) | local (a JSON-lines file)"),
    "source": ("-", "where the prompts come from: conf/workload/<name>.yaml, the file's URI or the package file"),
}

VERSIONS_FIELDS: dict[str, Entry] = {  # harness/job/setup.py versions()
    "harness": ("-", "the harness's version"),
    "code": ("-", "a digest of every harness and systems source file (resume refuses other code)"),
    "python": ("-", "Python's version"),
    "torch": ("-", "torch's version (its CUDA build shows here)"),
    "hydra": ("-", "hydra-core's version"),
    "transformers": ("-", "transformers' version"),
    "numpy": ("-", "numpy's version"),
    "numba": ("-", "numba's version (the compiled planning kernels)"),
    "mlflow": ("-", "mlflow's installed version (read from its metadata, not imported)"),
    "machine": ("-", "the host name"),
    "os": ("-", "the operating system and kernel release"),
    "cpu_model": ("-", "the CPU's model name (/proc/cpuinfo; the platform's processor elsewhere)"),
    "cpu_kernels": ("-", "the vector ISA torch's CPU kernels run (AVX2, AVX512, ...): bf16 decodes can differ "
                          "between them"),
    "cpu_count": ("cores", "logical CPUs the operating system reports"),
    "ram_gb": ("GB", "physical memory"),
    "gpu": ("-", "the CUDA device's name (only where torch sees one)"),
}

_SECTION = "run (harness/job/setup.py)"
_ENGINE = "engine (harness/engine/engine.py, ledger.py)"
_COUNTS = "counts (harness/job/live.py, replay.py)"
_LOSSLESS = "lossless (harness/decode/lossless.py)"
_TIMING = "timing"
_SERVING = "serving (workload.batch > 1 or workload.arrivals; harness/traces/serving.py, arrivals.py)"
_MEASURED = "timing, measured (harness/hybrid, backend=cuda)"

METRICS: dict[str, tuple[str, str, str]] = {  # name: (unit, section, meaning)
    "tokens_per_s": ("tokens/s", _SECTION, "generated tokens / modeled_time_s (timing=modeled), or the measured "
                                           "rate (timing=measured: the median over the repeats)"),
    "experts_per_layer_derived": ("experts", _SECTION, "B the budget formula gives (budget record)"),
    "budget_gb": ("GB", _SECTION, "the GPU memory budget"),
    "n_gpus": ("GPUs", _ENGINE, "GPUs of the topology (1 with offloading)"),
    "experts_per_layer": ("experts", _ENGINE, "B, the experts per MoE layer the GPU may hold"),
    "capacity": ("experts", _ENGINE, "the residency capacity of a layer (B, or B x GPUs)"),
    "total_capacity": ("experts", _ENGINE, "budget.scope=global: B x MoE layers, split as the system likes"),
    "forwards": ("forwards", _ENGINE, "model forwards (prefill, denoising and commit) charged"),
    "routed_pairs": ("(token, expert) pairs", _ENGINE, "routed pairs over every forward and MoE layer"),
    "missed_pairs": ("(token, expert) pairs", _ENGINE, "routed pairs whose expert was not resident on the GPU"),
    "miss_rate": ("fraction", _ENGINE, "missed_pairs / routed_pairs"),
    "io_bytes": ("bytes", _ENGINE, "host-to-GPU expert copies (sync, async and scratch) x expert bytes (bf16)"),
    "io_gb": ("GB", _ENGINE, "io_bytes / 1e9"),
    "cpu_expert_tokens": ("tokens", _ENGINE, "token-expert computations run on the CPU"),
    "copies_sync": ("expert copies", _ENGINE, "copies the forward waits for"),
    "copies_async": ("expert copies", _ENGINE, "copies overlapped with compute (prefetch, async migration)"),
    "copies_scratch": ("expert copies", _ENGINE, "one-use copies into a scratch slot (never cached)"),
    "copies_free": ("expert copies", _ENGINE, "moves the system is not charged for (the oracle's)"),
    "time_gpu_experts_s": ("s (modeled)", _ENGINE, "time charged to routed experts on the GPU"),
    "time_cpu_experts_s": ("s (modeled)", _ENGINE, "time charged to routed experts on the CPU beyond the GPU path"),
    "time_copies_s": ("s (modeled)", _ENGINE, "time charged to copies on the critical path"),
    "time_non_expert_s": ("s (modeled)", _ENGINE, "attention, dense layer, shared expert and the rest"),
    "busy_cpu_experts_s": ("s (modeled)", _ENGINE, "the CPU's busy time on experts, overlapped or not"),
    "busy_copies_s": ("s (modeled)", _ENGINE, "the copy engine's busy time, overlapped or not"),
    "modeled_time_s": ("s (modeled)", _ENGINE, "the run's modeled time: the sum of the four time_* figures"),
    "prompts": ("prompts", _COUNTS, "prompts decoded"),
    "generated_tokens": ("tokens", _COUNTS, "decoded positions before each prompt's first EOS, summed"),
    "requested_tokens": ("tokens", _COUNTS, "each prompt's gen_length (after decode.gen_length_bucket), summed; "
                         "generated_tokens below it means EOS ended decodes early"),
    "denoise_steps": ("steps", _COUNTS, "denoising forwards"),
    "decode_steps": ("steps", _COUNTS, "autoregressive families only: decode forwards (one token each)"),
    "time_prefill_s": ("s (modeled)", _SECTION, "autoregressive families only: the prefill forwards' time"),
    "time_decode_s": ("s (modeled)", _SECTION, "autoregressive families only: the decode forwards' time"),
    "ttft_s": ("s (modeled)", _SECTION, "autoregressive families only: time to first token (the prefill "
                                        "forward), mean over prefill forwards (one per prompt, or per batch)"),
    "serving_batches": ("batches", _SERVING, "batches of workload.batch requests served one after another"),
    "tpot_p50_s": ("s (modeled)", _SERVING, "per-request time per output token: (end of its last forward - end "
                                            "of its first forward that emits a token) / (its generated tokens - "
                                            "1); autoregressive: the mean latency of the decode forwards carrying "
                                            "its tokens; median over requests"),
    "tpot_p90_s": ("s (modeled)", _SERVING, "the same, 90th percentile"),
    "tpot_p99_s": ("s (modeled)", _SERVING, "the same, 99th percentile"),
    "e2e_latency_p50_s": ("s (modeled)", _SERVING, "per-request end-to-end latency (from its arrival, time 0 "
                                                   "with static batches, to the end of its last forward), median"),
    "e2e_latency_p90_s": ("s (modeled)", _SERVING, "the same, 90th percentile"),
    "e2e_latency_p99_s": ("s (modeled)", _SERVING, "the same, 99th percentile"),
    "e2e_latency_mean_s": ("s (modeled)", _SERVING, "the same, mean over requests"),
    "queue_p50_s": ("s (modeled)", _SERVING, "workload.arrivals only: per-request queueing delay (arrival to the "
                                             "start of its first forward), median over requests"),
    "queue_p90_s": ("s (modeled)", _SERVING, "the same, 90th percentile"),
    "queue_p99_s": ("s (modeled)", _SERVING, "the same, 99th percentile"),
    "ttft_p50_s": ("s (modeled)", _SERVING, "workload.arrivals only: per-request time to first token (arrival to "
                                            "the end of its first forward that emits a token), median"),
    "ttft_p90_s": ("s (modeled)", _SERVING, "the same, 90th percentile"),
    "ttft_p99_s": ("s (modeled)", _SERVING, "the same, 99th percentile"),
    "serving_peak_running": ("requests", _SERVING, "workload.arrivals only: the most requests one batch forward "
                                                   "carried (at most workload.batch)"),
    "tpot_s": ("s (modeled)", _SECTION, "autoregressive families only: time per output token (a decode forward)"),
    "routed_tokens": ("tokens", _COUNTS, "tokens routed through the MoE layers over every forward"),
    "lossless": ("0/1", _LOSSLESS, "1 when every generated token equals the gpu_only reference's"),
    "token_match_rate": ("fraction", _LOSSLESS, "generated tokens equal to the reference's"),
    "first_diff_prompt": ("index", _LOSSLESS, "the first prompt that differs (-1: none)"),
    "first_diff_position": ("index", _LOSSLESS, "its first differing position (-1: none)"),
    "wall_s": ("s (wall)", _TIMING, "live runs: decoding wall time on this machine"),
    "load_s": ("s (wall)", _TIMING, "live runs: loading (or building) the model"),
    "wall_tokens_per_s": ("tokens/s (wall)", _TIMING, "generated tokens / wall_s: this machine's speed, not the "
                                                      "modeled hardware's"),
    "replay_s": ("s (wall)", _TIMING, "replays: the replay's wall time"),
    "layer_steps_per_s": ("layer-steps/s (wall)", _TIMING, "replays: forwards x MoE layers / replay_s"),
    "modeled_tokens_per_s": ("tokens/s (modeled)", _MEASURED, "the cost model's rate beside the measured one"),
    "measured_time_s": ("s (measured)", _MEASURED, "the last measured repeat's decoding time"),
    "measured_host_plan_s": ("s (measured)", _MEASURED, "of which the system's planning on the host"),
    "measured_host_engine_s": ("s (measured)", _MEASURED, "of which the harness's own bookkeeping on the host"),
    "measured_gpu_span_s": ("s (measured)", _MEASURED, "GPU time from the first to the last kernel of each step"),
    "measured_gpu_experts_s": ("s (measured)", _MEASURED, "GPU time in routed experts"),
    "measured_cpu_experts_s": ("s (measured)", _MEASURED, "CPU time in routed experts"),
    "measured_steps": ("forwards", _MEASURED, "forwards measured"),
    "measured_warmup": ("repeats", _MEASURED, "decodes of the workload run first and discarded (timing.warmup)"),
    "measured_repeats": ("repeats", _MEASURED, "decodes of the workload measured (timing.repeats)"),
    "measured_tokens_per_s_p50": ("tokens/s (measured)", _MEASURED, "median of the repeats' rates"),
    "measured_tokens_per_s_p90": ("tokens/s (measured)", _MEASURED, "90th percentile of the repeats' rates"),
    "measured_time_s_p50": ("s (measured)", _MEASURED, "median of the repeats' decoding times"),
    "measured_time_s_p90": ("s (measured)", _MEASURED, "90th percentile of the repeats' decoding times"),
    "gpu_peak_mem_bytes": ("bytes", _MEASURED, "peak GPU memory allocated by torch"),
    "gpu_peak_mem_gb": ("GB", _MEASURED, "gpu_peak_mem_bytes / 1e9"),
    "gpu_expert_pool_bytes": ("bytes", _MEASURED, "the expert slot pools on the GPU"),
    "gpu_non_expert_bytes": ("bytes", _MEASURED, "the non-expert weights on the GPU"),
    "host_experts_pinned": ("0/1", _MEASURED, "1 when the host copies of the experts are pinned"),
    "host_expert_bytes": ("bytes", _MEASURED, "the experts held in host memory"),
    "gpu_slots_high_water": ("slots", _MEASURED, "the most expert slots in use at once"),
    "tau": ("denoising steps", "system report: tide", "the refresh interval used (tau=auto: tau*)"),
    "tau_star": ("denoising steps", "system report: tide", "the solver's refresh interval, argmin of Lat(tau)"),
    "refreshes": ("refreshes", "system report: tide, tide_adaptive", "residency refreshes over the run"),
    "migrated_experts": ("experts", "system report: tide, tide_adaptive", "experts moved by refreshes"),
    "drift_d": ("fraction", "system report: tide", "the routing drift d per step, from the calibration trace"),
    "steps_per_block": ("steps", "system report: tide", "T, the denoising steps per block the solver assumed"),
    "c_io_s": ("s (modeled)", "system report: tide", "the modeled time of one expert copy"),
    "c_cu_s": ("s (modeled)", "system report: tide", "the modeled CPU time of one token-expert pair"),
    "routed_pairs_per_step": ("(token, expert) pairs", "system report: tide", "the mean routed pairs per step and "
                                                                              "layer the solver used"),
    "tau_mean": ("denoising steps", "system report: tide (tau=random), tide_adaptive", "the mean tau over blocks"),
    "max_loads_in_flight": ("copies", "system report: mixtral_offload", "the most copies in flight at once"),
    "prefetched_experts": ("experts", "system report: mixtral_offload", "experts prefetched (prefetch=true)"),
    "dali_cached": ("experts", "system report: dali", "experts admitted to the cache"),
    "dali_cpu_experts": ("experts", "system report: dali", "layer-experts assigned to the CPU"),
    "dali_gpu_experts": ("experts", "system report: dali", "layer-experts assigned to the GPU"),
    "dali_prefetched": ("experts", "system report: dali", "experts prefetched"),
    "dali_scratch": ("experts", "system report: dali", "one-use copies"),
    "dali_predicted_layers": ("layers", "system report: dali",
                              "layer plans assigned from predicted loads (the rest from exact loads)"),
    "horizon": ("forwards", "system report: dali", "forwards the time-correlation cache score sums over"),
    "inexact_layers": ("layers", "system report: oracle", "layer plans the solver could not prove optimal"),
    "planned_layers": ("layers", "system report: oracle", "layer plans made"),
    "model_gb": ("GB", "system report: gpu_only", "the whole model's weights, bf16"),
    "calibration_gain": ("fraction", "system report: gem", "modeled gain of gem's mapping over ep_linear's on "
                                                             "the calibration trace"),
    "calibration_score_s": ("s (modeled)", "system report: gem", "gem's mapping on the calibration trace"),
    "gem_profiling_forwards": ("forwards", "system report: gem", "served forwards observed with ep_linear's mapping "
                                                                 "before the online search (window=online)"),
    "ep_linear_calibration_score_s": ("s (modeled)", "system report: gem", "ep_linear's mapping on the same trace"),
    "gem_profile_samples": ("latency samples", "GEM's measures (gem)", "GEM's profile: every GPU's latency curve "
                                                                         "sampled at tile boundaries"),
    "gem_dense_profile_samples": ("latency samples", "GEM's measures (gem)", "a dense profile: every token count "
                                                                               "0..the window's largest load, per GPU"),
    "gem_profile_error_mean": ("fraction", "GEM's measures (gem)", "relative error of the tile-boundary curve against "
                                                                   "the cost model, mean over token counts"),
    "gem_profile_error_max": ("fraction", "GEM's measures (gem)", "the same, largest"),
    "slowest_gpu_speed": ("relative speed", "system report: ep_linear", "the slowest GPU's speed in the topology"),
}

_MEASURES = "DALI's measures (harness/job/measures.py; measures=null: transformers families)"
_PHASE = r"(_(prefill|decode|denoise|commit))?"  # no suffix: the whole run; else one phase (forward kind)

METRIC_PATTERNS: dict[str, tuple[str, str, str]] = {  # regular expression: (unit, section, meaning)
    rf"gpu_busy_share{_PHASE}": (
        "fraction", _MEASURES, "(GPU expert + non-expert seconds) / modeled seconds, of the run or of one phase "
                               "(harness/accounting/phases.py)"),
    rf"cpu_busy_share{_PHASE}": ("fraction", _MEASURES, "CPU expert seconds (busy, overlapped or not) / modeled "
                                                        "seconds"),
    rf"cpu_expert_share{_PHASE}": ("fraction", _MEASURES, "CPU expert seconds / (CPU + GPU expert seconds): the "
                                                          "expert compute's CPU/GPU split"),
    rf"cpu_side_share{_PHASE}": ("fraction", _MEASURES, "CPU expert seconds / (CPU expert + GPU expert + copy "
                                                        "seconds): the split DALI balances (copies on the GPU side)"),
    rf"expert_hit_rate{_PHASE}": ("fraction", _MEASURES, "routed (layer, expert) pairs resident when the layer "
                                                         "started / routed pairs (each expert once per layer and "
                                                         "forward)"),
    rf"prefetch_(precision|recall)_(residual|next_gate|token_count){_PHASE}": (
        "fraction", _MEASURES, "of top_k experts named for layer l+1 by the residual hint (gate on the input minus "
                               "the layer's running mean), the next_gate hint (gate on the input) or earlier token "
                               "counts: named ones used / named (precision), / used (recall) "
                               "(harness/traces/dali_measures.py)"),
    rf"cache_hit_rate_(workload|lru|lfu){_PHASE}": (
        "fraction", _MEASURES, "a B-expert cache per layer replayed over the run's trace with DALI's workload "
                               "replacement, LRU or LFU: demanded experts found cached / demanded"),
    r"routing_(uniform_)?(distinct_experts_per_layer_step|top_b_share|unused_experts_per_layer|popularity_cv|"
    r"cross_prompt_popularity_corr|tokens_per_denoise_step|top_b_share_step|load_entropy|temporal_locality|"
    r"lru_hit_rate|load_entropy_prefill|load_entropy_decode|prefill_decode_popularity_corr|cosine_k\d+)": (
        "see harness/traces/routing_stats.py", "routing (trace.record=true; replays of an imported trace)",
        "routing_<statistic> of the run's trace, routing_uniform_<statistic> the same under uniform routing "
        "(the README's \"How realistic is the proxy's routing\")"),
}
