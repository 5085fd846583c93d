#!/usr/bin/env bash
# Train the mini proxy on a GPU (recipe=gpu, docs/proxies.md) and measure what it learned, sized
# for about 10 minutes of a lent GPU. Run it after scripts/gpu_check.sh, or in a session of
# its own:
#
#   OUT=/some/dir bash scripts/gpu_train.sh
#
# 1. the CUDA training test (tests/integration/test_training.py -m cuda);
# 2. python -m harness.train model=mini recipe=gpu: training.json (loss, masked CE by mask
#    ratio, wall time), the loss curve and a sample decode;
# 3. a gpu_only run (backend=cpu) on the trained proxy with a routing trace, and its statistics
#    (python -m harness.analyze ... format=json) in $OUT/routing.json;
# 4. the checkpoint itself in $OUT/checkpoint, to be used elsewhere with model.path=<it>.
#
# Dry run without a GPU (checks the script, not the GPU):
#   MODEL=tiny RECIPE=cpu OUT=/tmp/x bash scripts/gpu_train.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-outputs/gpu_train}"
MODEL="${MODEL:-mini}"
RECIPE="${RECIPE:-gpu}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export HARNESS_CACHE="$OUT/cache"

if [ "$RECIPE" = gpu ]; then
  echo "== 1. CUDA training test"
  timeout 150 python -m pytest tests/integration/test_training.py -q -m cuda -p no:cacheprovider > "$OUT/pytest_cuda.txt" 2>&1
  echo "pytest exit $?"; tail -3 "$OUT/pytest_cuda.txt"
fi

echo "== 2. train $MODEL (recipe=$RECIPE)"
timeout 480 python -m harness.train "model=$MODEL" "recipe=$RECIPE" "cache_dir=$HARNESS_CACHE" > "$OUT/train.log" 2>&1
echo "train exit $?"; tr '\r' '\n' < "$OUT/train.log" | grep -v "step/s\|s/step" | tail -6
CHECKPOINT="$(sed -n 's/.*trained proxy, recipe [a-z]* ([^)]*): //p' "$OUT/train.log" | tail -1)"
if [ -z "$CHECKPOINT" ] || [ ! -d "$CHECKPOINT" ]; then
  echo "no checkpoint: see $OUT/train.log"; exit 1
fi
cp "$CHECKPOINT"/training.json "$CHECKPOINT"/train_loss.csv "$CHECKPOINT"/train_loss.png "$OUT"/

echo "== 3. routing of the trained proxy (gpu_only, trace recorded)"
# backend=cpu: the routing does not depend on the backend, and gpu_check.sh tests the CUDA path
timeout 240 python -m harness "model=$MODEL" "model.path=$CHECKPOINT" system=gpu_only trace.record=true \
  backend=cpu tracking.enabled=false "hydra.run.dir=$OUT/run" > "$OUT/run.log" 2>&1
echo "run exit $?"; tr '\r' '\n' < "$OUT/run.log" | grep -E "^\[gpu_only\]|first prompt" | tail -2
timeout 60 python -m harness.analyze "trace=$OUT/run/trace.npz" B=64 format=json > "$OUT/routing.json" 2>&1
echo "analyze exit $?"; head -c 600 "$OUT/routing.json"; echo

echo "== 4. the checkpoint"
mkdir -p "$OUT/checkpoint" && cp "$CHECKPOINT"/* "$OUT/checkpoint/"
du -sh "$OUT/checkpoint"
