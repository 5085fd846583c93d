"""The DALI table of docs/results/2026-12-02-dali.md from a finished `+experiment=dali` sweep:
per model and budget, each system's modeled end-to-end time, ttft, tpot and DALI's measures,
and the paper's claims beside the harness's figures.

    PYTHONPATH=. python scripts/dali_claims.py outputs/multirun/<sweep>
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.results.run_result import RunResult

ROWS = ["static_split", "fiddler", "mixtral_offload", "dali", "dali (assign=false)", "dali (prefetch=false)",
        "dali (replacement=false)"]


def label(result: RunResult) -> str:
    system = result.config["system"]
    off = [k for k in ("assign", "prefetch", "replacement") if system.get(k) is False and system["name"] == "dali"]
    return f"{result.identity.system} ({off[0]}=false)" if off else str(result.identity.system)


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def cpu_side(m: dict) -> float:
    """The CPU's share of both sides' busy time when the GPU side counts its copies too
    (DALI's Phi charges a copy to the GPU side)."""
    gpu = m["time_gpu_experts_s"] + m["busy_copies_s"]
    return m["busy_cpu_experts_s"] / (m["busy_cpu_experts_s"] + gpu)


def main(sweep: Path) -> None:
    cells: dict[tuple[str, int], dict[str, dict]] = {}
    for path in sorted(sweep.glob("*/result.json")):
        r = RunResult.from_json(path)
        m = r.flat_metrics()
        cells.setdefault((str(r.identity.model), int(r.budget["experts_per_layer"])), {})[label(r)] = {
            **m, "gpu_gb": r.budget["gpu_gb"]}
    for (model, b), runs in sorted(cells.items()):
        gb = next(iter(runs.values()))["gpu_gb"]
        print(f"\n### {model}, {gb:g} GB (B={b})\n")
        print("| system | modeled time s | tok/s | ttft ms | tpot ms | CPU share of expert work run (prefill / decode)"
              " | CPU / GPU side with copies | CPU busy / GPU busy (decode) | expert hit rate (decode) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for row in ROWS:
            m = runs[row]
            print(f"| {row} | {m['modeled_time_s']:.2f} | {m['tokens_per_s']:.1f} | {1e3 * m['ttft_s']:.0f} | "
                  f"{1e3 * m['tpot_s']:.1f} | {pct(m['cpu_expert_share'])} ({pct(m['cpu_expert_share_prefill'])} / "
                  f"{pct(m['cpu_expert_share_decode'])}) | {pct(cpu_side(m))} / {pct(1 - cpu_side(m))} | "
                  f"{pct(m['cpu_busy_share_decode'])} / "
                  f"{pct(m['gpu_busy_share_decode'])} | {pct(m['expert_hit_rate_decode'])} |")
        d, s = runs["dali"], runs["static_split"]
        worst = max((r for r in ROWS[:3]), key=lambda r: runs[r]["modeled_time_s"])
        print(f"\nclaims: cpu/gpu expert split dali {pct(d['cpu_expert_share'])}/{pct(1 - d['cpu_expert_share'])} "
              f"static {pct(s['cpu_expert_share'])}/{pct(1 - s['cpu_expert_share'])}; "
              f"utilisation (busy / modeled wall time) CPU/GPU dali {pct(d['cpu_busy_share'])}/"
              f"{pct(d['gpu_busy_share'])} static {pct(s['cpu_busy_share'])}/{pct(s['gpu_busy_share'])}; "
              f"residual recall decode {pct(d.get('prefetch_recall_residual_decode'))} next-gate "
              f"{pct(d.get('prefetch_recall_next_gate_decode'))} token-count "
              f"{pct(d['prefetch_recall_token_count_decode'])}; cache decode workload "
              f"{pct(d['cache_hit_rate_workload_decode'])} lru {pct(d['cache_hit_rate_lru_decode'])} lfu "
              f"{pct(d['cache_hit_rate_lfu_decode'])}; run hit dali {pct(d['expert_hit_rate_decode'])} vs LRU "
              f"{pct(runs['dali (replacement=false)']['expert_hit_rate_decode'])}; latency: "
              + ", ".join(f"{r} {runs[r]['modeled_time_s'] / d['modeled_time_s']:.2f}x" for r in ROWS[:3])
              + f" (most: {worst})")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
