#!/usr/bin/env bash
# The prepared GPU check of docs/gpu.md (backend=cuda), sized to finish in about 8 minutes on
# one GPU. Run it from anywhere on a machine with a CUDA build of torch:
#
#   OUT=/some/dir bash scripts/gpu_check.sh
#
# 1. the CUDA-only tests (tests/integration/test_hybrid.py -m cuda);
# 2. hardware=local on this machine: CPU expert table, GPU expert latency at several token
#    counts with the fitted roofline, pinned host->device bandwidth (written to $OUT);
# 3. the mini proxy at one budget with gpu_only, fiddler, mixtral_offload and tide,
#    backend=cuda: each result.json holds the measured tokens/s (timing=measured) and the
#    modeled tokens/s under the local profile beside it, peak GPU memory, and the token
#    match rate against the gpu_only run on this GPU (run first: it is the reference);
# 4. a summary table of the four runs ($OUT/summary.tsv).
#
# Everything lands under $OUT (default outputs/gpu_check). Each step has its own time limit
# so that a hang in one still leaves the others' results.
#
# Dry run without a GPU (checks the script and the device pipeline, not the GPU; its
# "measured" times are CPU times):  BACKEND=standin MODEL=tiny OUT=/tmp/x bash scripts/gpu_check.sh
# SYSTEMS="gpu_only tide" runs fewer systems (gpu_only first: it is the reference);
# CUDA_TESTS=0 skips step 1.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-outputs/gpu_check}"
BACKEND="${BACKEND:-cuda}"
MODEL="${MODEL:-mini}"
read -r -a SYSTEMS <<< "${SYSTEMS:-gpu_only fiddler mixtral_offload tide}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export HARNESS_CACHE="$OUT/cache"
export HYDRA_FULL_ERROR=1  # a failure shows its traceback in the step's log

python - > "$OUT/env.txt" 2>&1 <<'EOF'
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
print("cuda available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(), "memory GB", torch.cuda.get_device_properties(0).total_memory / 1e9)
print("cpu threads", torch.get_num_threads())
EOF
cat "$OUT/env.txt"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true

# a step's exit code, and whether `timeout` (exit 124) cut it short: the device time is budgeted
said_exit() { if [ "$2" = 124 ]; then echo "$1 exit 124 (timed out after $3 s)"; else echo "$1 exit $2"; fi; }

if [ "${CUDA_TESTS:-1}" != 0 ]; then
  echo "== 1. CUDA tests"
  timeout 150 python -m pytest tests/integration/test_hybrid.py -q -m cuda -p no:cacheprovider > "$OUT/pytest_cuda.txt" 2>&1
  said_exit pytest $? 150; tail -3 "$OUT/pytest_cuda.txt"
fi

COMMON=("model=$MODEL" budget=10GB decode.gen_length=32 limit_prompts=2 "backend=$BACKEND" show_text=false
        tracking.enabled=false hardware=local "hardware.profile_path=$OUT/local_profile.json")
echo "== 2+3. hardware=local, then the four systems (backend=$BACKEND, model=$MODEL)"
for system in "${SYSTEMS[@]}"; do
  timeout 300 python -m harness "system=$system" "${COMMON[@]}" "hydra.run.dir=$OUT/runs/$system" \
    > "$OUT/$system.log" 2>&1
  said_exit "$system" $? 300; grep -E "^\[$system\]|error" "$OUT/$system.log" | tail -2
done

echo "== 4. summary"
python - "$OUT" "${SYSTEMS[@]}" <<'EOF' | tee "$OUT/summary.tsv"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
keys = ["tokens_per_s", "measured_tokens_per_s_p50", "measured_tokens_per_s_p90", "modeled_tokens_per_s",
        "wall_tokens_per_s", "token_match_rate", "first_diff_position",
        "miss_rate", "cpu_expert_tokens", "io_gb", "gpu_peak_mem_gb", "gpu_expert_pool_bytes",
        "measured_gpu_experts_s", "measured_cpu_experts_s", "host_experts_pinned", "experts_per_layer"]
print("\t".join(["system", "timing", *keys]))
for system in sys.argv[2:]:
    path = out / "runs" / system / "result.json"
    if not path.exists():
        print(f"{system}\tmissing")
        continue
    r = json.loads(path.read_text())
    m = r["metrics"]
    print("\t".join([system, r["timing"], *(f"{m[k]:.4g}" if isinstance(m.get(k), float) else str(m.get(k))
                                             for k in keys)]))
profile = out / "local_profile.json"
if profile.exists():
    for shape, entry in json.loads(profile.read_text())["shapes"].items():
        print(f"# profile {shape}: gpu={entry.get('gpu')} gpu_table_s={entry.get('gpu_table_seconds')}")
EOF
