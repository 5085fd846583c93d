#!/usr/bin/env bash
# The cluster check of docs/clusters.md: sweeps through Hydra's submitit launcher into a shared
# MLflow server on PostgreSQL, run for real on this one machine, only on 127.0.0.1.
#
#   bash scripts/cluster_check.sh                  # SLURM: hydra/launcher=slurm
#   bash scripts/cluster_check.sh submitit_local   # the submitit path without SLURM (lighter)
#
# Needs root (it installs Debian packages when missing and runs PostgreSQL as `postgres`).
# 1. packages: installs what is missing (apt-get update first): postgresql, and for SLURM
#    slurm-wlm, munge, slurmdbd and mariadb-{server,client}-core (sacct needs slurmdbd, which stores
#    only in MariaDB/MySQL); psycopg2-binary from PyPI (what `pip install .[cluster]` adds).
# 2. services, in a temporary folder: munged, mariadbd, slurmdbd, slurmctld and slurmd with
#    a one-node configuration (this node's CPUs and memory as `slurmd -C` reports them, one
#    partition); PostgreSQL with a database for MLflow; `mlflow server` on it, on free ports.
# 3. sweep: model=tiny x system=gpu_only,fiddler,tide x budget=10GB,18GB (six jobs) as a
#    SLURM job array; sacct must show six COMPLETED tasks; the server must hold one parent
#    FINISHED, six children, each job logged once, metrics equal to every result.json.
# 4. resume: the same grid in a new sweep dir, interrupted once two results exist (SLURM:
#    `scancel` of its array; submitit_local: SIGTERM to the launcher, SIGKILL to its jobs),
#    then `resume=true` in that sweep dir: six results, each logged exactly once, under the
#    one parent, now FINISHED.
# 5. teardown: every process started here is stopped by its process id, the temporary
#    folder removed; the logs are kept in $OUT (default outputs/cluster_check/<launcher>).
# One summary line per check (`ok <check>: ...` or `FAILED <check>: ...`); exit 1 if one failed.
set -uo pipefail
cd "$(dirname "$0")/.."
LAUNCHER="${1:-slurm}"
case "$LAUNCHER" in slurm|submitit_local) ;; *) echo "error: launcher must be slurm or submitit_local, not '$LAUNCHER'" >&2; exit 2;; esac
if [ "$(id -u)" != 0 ]; then echo "error: run as root (it installs packages and runs PostgreSQL as postgres)" >&2; exit 2; fi
OUT="${OUT:-outputs/cluster_check/$LAUNCHER}"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"
SWEEP_TIMEOUT="${SWEEP_TIMEOUT:-1500}"  # seconds for one sweep
WORK=$(mktemp -d /tmp/harness-cluster-check.XXXXXX)
chmod 711 "$WORK"  # postgres (its own user) must reach its data dir below
mkdir -p "$WORK/log" "$WORK/slurm" "$WORK/sweeps"
export SLURM_CONF="$WORK/slurm/slurm.conf"
export HARNESS_CACHE="$WORK/cache"
# nothing may leave 127.0.0.1 (MLflow's telemetry would, and its failure races with logging)
export MLFLOW_DISABLE_TELEMETRY=true
DB_PASSWORD=$(python -c "import secrets; print(secrets.token_hex(12))")
FAILED=0
START=$SECONDS

# shellcheck source=scripts/cluster_services.sh
source scripts/cluster_services.sh

report() {  # ok|FAILED CHECK DETAILS (seconds since STEP_START)
  echo "$1 $2: $3 ($((SECONDS - STEP_START)) s)" | tee -a "$OUT/summary.txt"
  [ "$1" = ok ] || FAILED=1
}

teardown() {
  STEP_START=$SECONDS
  trap - EXIT INT TERM
  local left
  left=$(stop_all)
  cp -r "$WORK/log" "$OUT/" 2>/dev/null
  for sweep in "$WORK"/sweeps/*; do  # the jobs' own logs (submitit), beside the launcher's
    [ -d "$sweep/.submitit" ] && mkdir -p "$OUT/jobs/$(basename "$sweep")" \
      && find "$sweep/.submitit" \( -name '*.out' -o -name '*.err' \) -exec cp {} "$OUT/jobs/$(basename "$sweep")/" \;
  done
  local count
  count=$(wc -l < "$PIDS_FILE")
  rm -rf "$WORK"
  if [ -z "$left" ] && [ ! -e "$WORK" ]; then
    report ok teardown "$count processes stopped by pid, nothing left running, $WORK removed"
  else
    report FAILED teardown "still running:${left:- none}; $WORK $([ -e "$WORK" ] && echo kept || echo removed)"
  fi
  echo "total $((SECONDS - START)) s; logs in $OUT" | tee -a "$OUT/summary.txt"
  exit $FAILED
}
trap teardown EXIT
trap 'exit 130' INT TERM
: > "$OUT/summary.txt"

# ---------------------------------------------------------------------------- 1. packages
STEP_START=$SECONDS
PACKAGES=(postgresql)
[ "$LAUNCHER" = slurm ] && PACKAGES+=(slurm-wlm munge slurmdbd mariadb-server-core mariadb-client-core)
MISSING=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || MISSING+=("$p")
done
if [ ${#MISSING[@]} -gt 0 ]; then
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${MISSING[@]}"; } \
    > "$WORK/log/apt.log" 2>&1
fi
PIP=""
if ! python -c "import psycopg2" 2>/dev/null; then
  python -m pip install -q "psycopg2-binary>=2.9" > "$WORK/log/pip.log" 2>&1
  PIP="; pip installed psycopg2-binary"
fi
TOOLS=(psql)
[ "$LAUNCHER" = slurm ] && TOOLS+=(sbatch sacct scancel slurmctld slurmd slurmdbd munged mariadbd mariadb-install-db)
ABSENT=$(for t in "${TOOLS[@]}"; do command -v "$t" > /dev/null || echo "$t"; done)
if python -c "import psycopg2" 2>/dev/null && [ -n "$(pg_bin postgres)" ] && [ -z "$ABSENT" ]; then
  report ok packages "${PACKAGES[*]} psycopg2 present$([ ${#MISSING[@]} -gt 0 ] && echo "; apt installed ${MISSING[*]}")$PIP"
else
  report FAILED packages "missing after the install: $(echo $ABSENT) (see $OUT/log/apt.log, pip.log)"
  exit 1
fi

# ---------------------------------------------------------------------------- 2. services
STEP_START=$SECONDS
read -r PG_PORT MLFLOW_PORT DB_PORT DBD_PORT CTLD_PORT SLURMD_PORT <<< "$(free_ports 6)"
PARTITION=harness
SERVICES_OK=1
if [ "$LAUNCHER" = slurm ]; then
  { start_munge && start_mariadb "$DB_PORT" && start_slurmdbd "$DBD_PORT" "$DB_PORT" \
      && start_slurm "$CTLD_PORT" "$SLURMD_PORT" "$DBD_PORT" "$PARTITION"; } >> "$WORK/log/services.log" 2>&1 \
    || SERVICES_OK=0
fi
[ $SERVICES_OK = 1 ] && { start_postgres "$PG_PORT" && start_mlflow_server "$PG_PORT" "$MLFLOW_PORT"; } \
  >> "$WORK/log/services.log" 2>&1 || SERVICES_OK=0
URI="http://127.0.0.1:$MLFLOW_PORT"
if [ $SERVICES_OK = 1 ]; then
  NODE=""
  [ "$LAUNCHER" = slurm ] && NODE="; SLURM node $(scontrol show node "$NODE_NAME" | grep -oE '(CPUTot|RealMemory)=[0-9]+' | tr '\n' ' ')in partition $PARTITION"
  report ok services "$(cut -d' ' -f1 "$PIDS_FILE" | tr '\n' ' ')up; mlflow server $URI on PostgreSQL 127.0.0.1:$PG_PORT$NODE"
else
  report FAILED services "could not start them all: $(tail -3 "$WORK/log/services.log" | tr '\n' ' ')"
  exit 1
fi

# ---------------------------------------------------------------------------- sweeps
# the smallest decode that still runs a prefill, denoising steps and a commit; one calibration prompt
GRID=(model=tiny system=gpu_only,fiddler,tide budget=10GB,18GB decode.gen_length=4 decode.block_length=4
      decode.steps=2 limit_prompts=1 show_text=false "calibration.prompts=[Implement a queue using two stacks.]"
      "tracking.uri=$URI")
if [ "$LAUNCHER" = slurm ]; then
  LAUNCH=(hydra/launcher=slurm "hydra.launcher.partition=$PARTITION" hydra.launcher.gpus_per_node=0
          hydra.launcher.cpus_per_task=1 hydra.launcher.mem_gb=3 hydra.launcher.timeout_min=30
          hydra.launcher.array_parallelism=2)
else
  LAUNCH=(hydra/launcher=submitit_local hydra.launcher.timeout_min=30)
fi

sweep() {  # SWEEP_DIR LOG [OVERRIDES...]: the sweep in the foreground; its exit code
  local dir=$1 log=$2
  shift 2
  timeout "$SWEEP_TIMEOUT" python -m harness -m "${LAUNCH[@]}" "${GRID[@]}" "hydra.sweep.dir=$dir" "$@" \
    > "$WORK/log/$log" 2>&1
}

results_in() { find "$1" -mindepth 2 -maxdepth 2 -name result.json 2>/dev/null | wc -l; }
array_id() {  # SWEEP_DIR: the SLURM array job id, from submitit's <array>_<task> folders
  find "$1/.submitit" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended -regex '.*/[0-9]+_[0-9]+' \
    -printf '%f\n' 2>/dev/null | head -1 | cut -d_ -f1
}
sacct_states() {  # ARRAY_ID: "N STATE" per state of its tasks
  sacct -X -n -P -j "$1" -o State 2>/dev/null | sed 's/ by .*//' | sort | uniq -c | awk '{print $1, $2}' | paste -sd, -
}
store_check() { python -m harness.audit_store "$1" --uri "${2:-$URI}" --jobs "${3:-6}" 2>&1 | tail -1; }

# ---------------------------------------------------------------------------- 3. the sweep
STEP_START=$SECONDS
FULL="$WORK/sweeps/full"
sweep "$FULL" sweep_full.log
rc=$?
report "$([ $rc = 0 ] && echo ok || echo FAILED)" sweep "hydra/launcher=$LAUNCHER, 6 jobs, exit $rc, $(results_in "$FULL") result.json"
if [ "$LAUNCHER" = slurm ]; then
  STEP_START=$SECONDS
  ARRAY=$(array_id "$FULL")
  STATES=$(sacct_states "$ARRAY")
  [ "$STATES" = "6 COMPLETED" ] && v=ok || v=FAILED
  report $v sacct "array job ${ARRAY:-?}: ${STATES:-no tasks} (expected 6 COMPLETED)"
fi
STEP_START=$SECONDS
line=$(store_check "$FULL")
report "$([[ $line == *": ok: "* ]] && echo ok || echo FAILED)" store "${line#*: }"

# ---------------------------------------------------------------------------- SLURM + SQLite
# the default store is a SQLite file: the launching process warns, the jobs leave it alone,
# and the launching process logs their results at the end (harness/tracking/cluster.py)
if [ "$LAUNCHER" = slurm ]; then
  STEP_START=$SECONDS
  LITE="$WORK/sweeps/sqlite"
  LITE_URI="sqlite:///$WORK/sqlite/mlflow.db"
  timeout "$SWEEP_TIMEOUT" python -m harness -m "${LAUNCH[@]}" "${GRID[@]}" system=gpu_only "tracking.uri=$LITE_URI" \
    "hydra.sweep.dir=$LITE" > "$WORK/log/sweep_sqlite.log" 2>&1
  rc=$?
  WARNED=$(grep -c "is a SQLite file .* and the launcher is SLURM" "$WORK/log/sweep_sqlite.log")
  LEFT=$(cat "$LITE"/.submitit/*/*_log.out 2>/dev/null | grep -c "logged by the launching process")
  line=$(store_check "$LITE" "$LITE_URI" 2)
  [ $rc = 0 ] && [ "$WARNED" = 1 ] && [ "$LEFT" = 2 ] && [[ $line == *": ok: "* ]] && v=ok || v=FAILED
  report $v sqlite "2 jobs with tracking.uri=sqlite: exit $rc, warned $WARNED time, $LEFT jobs left logging to the launching process; ${line#*: }"
fi

# ---------------------------------------------------------------------------- 4. resume
# Once two results exist: SLURM, scancel of the array (submitit learns of it from sacct and
# the launching process fails); submitit_local, SIGTERM to the launching process and SIGKILL
# to its jobs. Then resume=true in the same sweep dir.
STEP_START=$SECONDS
PART="$WORK/sweeps/resume"
# the same configs: without the first sweep's resume index (cache/results), or resume=true would
# reuse the first sweep's results instead of this sweep's own
cp -r "$HARNESS_CACHE" "$WORK/cache-resume" && rm -rf "$WORK/cache-resume/results"
export HARNESS_CACHE="$WORK/cache-resume"
setsid python -m harness -m "${LAUNCH[@]}" "${GRID[@]}" "hydra.sweep.dir=$PART" > "$WORK/log/sweep_interrupted.log" 2>&1 &
LAUNCHING=$!
record_pid sweep-launcher $LAUNCHING group  # stopped by the teardown if still running
for _ in $(seq 1 "$SWEEP_TIMEOUT"); do
  [ "$(results_in "$PART")" -ge 2 ] || ! alive $LAUNCHING && break
  sleep 1
done
BEFORE=$(results_in "$PART")
if [ "$LAUNCHER" = slurm ]; then
  ARRAY=$(array_id "$PART")
  scancel "$ARRAY"
  HOW="scancel of array job $ARRAY"
  wait $LAUNCHING  # submitit learns the cancelled tasks' state from sacct and gives up
  rc=$?
else
  # its local jobs (submitit controllers and their tasks, in its process group) ignore SIGTERM:
  # kill them first, as a lost machine would, then stop the launching process, which ends its
  # parent run KILLED
  JOBS=$(pgrep -g $LAUNCHING | grep -vx $LAUNCHING)
  [ -n "$JOBS" ] && kill -KILL $JOBS
  kill -TERM $LAUNCHING
  wait $LAUNCHING
  rc=$?
  HOW="SIGKILL to its $(wc -w <<< "$JOBS") job processes, SIGTERM to the launching process,"
fi
[ "$LAUNCHER" = slurm ] && HOW="$HOW (sacct: $(sacct_states "$ARRAY"))"
[ "$BEFORE" -ge 2 ] && [ "$BEFORE" -lt 6 ] && [ $rc != 0 ] && v=ok || v=FAILED
report $v interrupt "$HOW with $BEFORE of 6 results; launching process exit $rc"

STEP_START=$SECONDS
sweep "$PART" sweep_resumed.log resume=true
rc=$?
REUSED=$(find "$PART" -mindepth 2 -maxdepth 2 -name resumed.json | wc -l)
line=$(store_check "$PART")
# the results from before the interruption are reused, and at least one job had to run again
[ $rc = 0 ] && [ "$(results_in "$PART")" = 6 ] && [ "$REUSED" -ge 2 ] && [ "$REUSED" -lt 6 ] \
  && [[ $line == *": ok: "* ]] && v=ok || v=FAILED
report $v resume "resume=true exit $rc: $REUSED jobs reused, $((6 - REUSED)) run, $(results_in "$PART") result.json; ${line#*: }"
exit $FAILED  # teardown (trap) stops the services and adds its line
