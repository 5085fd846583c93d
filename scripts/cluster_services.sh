# Sourced by scripts/cluster_check.sh: start and stop the services of a one-node SLURM
# cluster and of an MLflow server on PostgreSQL, all inside $WORK and only on 127.0.0.1.
#
# Every service runs in the foreground of a background process started here, so that its
# process id is known ($! or the daemon's own pid file) and recorded in $WORK/pids; stop_all
# stops exactly those processes, by id, in reverse order. Nothing here touches /etc, /run or
# the system's own services.

PIDS_FILE="$WORK/pids"
: > "$PIDS_FILE"

record_pid() {  # NAME PID [group]: "group" = the process leads its own process group
  echo "$1 $2 ${3:-}" >> "$PIDS_FILE"
}

free_ports() {  # N: N distinct TCP ports free on 127.0.0.1 right now
  python - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

wait_for() {  # SECONDS DESCRIPTION COMMAND...: poll COMMAND every second until it succeeds
  local limit=$1 what=$2
  shift 2
  for _ in $(seq 1 "$limit"); do
    if "$@" > /dev/null 2>&1; then return 0; fi
    sleep 1
  done
  echo "timed out after ${limit}s waiting for $what" >&2
  return 1
}

port_open() { python -c "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 1).close()" "$1"; }

# ---------------------------------------------------------------------------- munge

start_munge() {
  mkdir -p "$WORK/munge/key" "$WORK/munge/run"
  chmod 700 "$WORK/munge/key"
  chmod 755 "$WORK/munge/run"  # munged insists that every user may reach its socket
  dd if=/dev/urandom of="$WORK/munge/key/munge.key" bs=1024 count=1 status=none
  chmod 600 "$WORK/munge/key/munge.key"
  MUNGE_SOCKET="$WORK/munge/run/munge.socket"
  munged --foreground --force --key-file="$WORK/munge/key/munge.key" --socket="$MUNGE_SOCKET" \
    --pid-file="$WORK/munge/run/munged.pid" --seed-file="$WORK/munge/key/seed" \
    --log-file="$WORK/log/munged.log" > /dev/null 2>&1 &
  record_pid munged $!
  wait_for 20 munged test -S "$MUNGE_SOCKET"
}

# ---------------------------------------------------------------------------- accounting: MariaDB + slurmdbd
# sacct (which submitit polls for job states, and this check uses to count jobs) needs
# slurmdbd, and slurmdbd stores only in MySQL/MariaDB.

start_mariadb() {  # PORT
  mkdir -p "$WORK/mariadb"
  mariadb-install-db --no-defaults --datadir="$WORK/mariadb/data" --user=root \
    --auth-root-authentication-method=normal --skip-test-db > "$WORK/log/mariadb-install.log" 2>&1 || return 1
  MARIADB_SOCKET="$WORK/mariadb/mysqld.sock"
  mariadbd --no-defaults --datadir="$WORK/mariadb/data" --user=root --socket="$MARIADB_SOCKET" \
    --bind-address=127.0.0.1 --port="$1" --pid-file="$WORK/mariadb/mariadbd.pid" \
    --log-error="$WORK/log/mariadbd.log" --innodb-buffer-pool-size=64M > /dev/null 2>&1 &
  record_pid mariadbd $!
  wait_for 60 mariadbd mariadb --no-defaults --socket="$MARIADB_SOCKET" -uroot -e "select 1" || return 1
  mariadb --no-defaults --socket="$MARIADB_SOCKET" -uroot -e "
    create database slurm_acct_db;
    create user 'slurm'@'127.0.0.1' identified by '$DB_PASSWORD';
    grant all on slurm_acct_db.* to 'slurm'@'127.0.0.1';"
}

start_slurmdbd() {  # DBD_PORT MARIADB_PORT
  cat > "$WORK/slurm/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdAddr=127.0.0.1
DbdHost=localhost
DbdPort=$1
SlurmUser=root
PidFile=$WORK/slurm/slurmdbd.pid
LogFile=$WORK/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$2
StorageUser=slurm
StoragePass=$DB_PASSWORD
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$WORK/slurm/slurmdbd.conf"  # slurmdbd refuses a readable config (it holds a password)
  slurmdbd -D > /dev/null 2>&1 &  # reads slurmdbd.conf next to $SLURM_CONF
  record_pid slurmdbd $!
  wait_for 60 slurmdbd port_open "$1"
}

# ---------------------------------------------------------------------------- slurmctld + slurmd

write_slurm_conf() {  # CTLD_PORT SLURMD_PORT DBD_PORT PARTITION
  # the node's real CPUs, sockets, cores and memory, as slurmd itself detects them
  local node
  node=$(slurmd -C | head -1)
  NODE_NAME=$(sed -E 's/^NodeName=([^ ]+).*/\1/' <<< "$node")
  cat > "$SLURM_CONF" <<EOF
ClusterName=harnesscheck
SlurmctldHost=$NODE_NAME(127.0.0.1)
SlurmctldPort=$1
SlurmdPort=$2
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$WORK/slurm/state
SlurmdSpoolDir=$WORK/slurm/spool
SlurmctldPidFile=$WORK/slurm/slurmctld.pid
SlurmdPidFile=$WORK/slurm/slurmd.pid
SlurmctldLogFile=$WORK/log/slurmctld.log
SlurmdLogFile=$WORK/log/slurmd.log
# a container: no cgroups, no systemd; processes tracked through /proc
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$3
# for slurmdbd this is the munge socket, not a password
AccountingStoragePass=$MUNGE_SOCKET
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MpiDefault=none
KillWait=5
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=$4 Nodes=$NODE_NAME Default=YES MaxTime=INFINITE State=UP
EOF
}

node_idle() { [ "$(sinfo -h -n "$NODE_NAME" -o %T 2>/dev/null)" = idle ]; }

start_slurm() {  # CTLD_PORT SLURMD_PORT DBD_PORT PARTITION
  mkdir -p "$WORK/slurm/state" "$WORK/slurm/spool"
  write_slurm_conf "$@"
  slurmctld -D > /dev/null 2>&1 &
  record_pid slurmctld $!
  wait_for 60 slurmctld scontrol ping || return 1
  slurmd -D > /dev/null 2>&1 &
  record_pid slurmd $!
  wait_for 60 "node $NODE_NAME idle" node_idle
}

# ---------------------------------------------------------------------------- PostgreSQL + mlflow server

pg_bin() {  # Debian keeps the server programs out of PATH
  if command -v "$1" > /dev/null; then command -v "$1"; return; fi
  ls /usr/lib/postgresql/*/bin/"$1" 2>/dev/null | sort -V | tail -1
}

AS_POSTGRES=(setpriv --reuid=postgres --regid=postgres --init-groups)  # postgres refuses root; execs, same pid

start_postgres() {  # PORT
  mkdir -p "$WORK/pg"
  chown postgres:postgres "$WORK/pg"
  chmod 700 "$WORK/pg"
  echo "$DB_PASSWORD" > "$WORK/pg/pwfile"
  chown postgres "$WORK/pg/pwfile"
  "${AS_POSTGRES[@]}" "$(pg_bin initdb)" -D "$WORK/pg/data" -U postgres --pwfile="$WORK/pg/pwfile" \
    --auth=scram-sha-256 -E UTF8 > "$WORK/log/initdb.log" 2>&1 || return 1
  "${AS_POSTGRES[@]}" "$(pg_bin postgres)" -D "$WORK/pg/data" -c listen_addresses=127.0.0.1 -p "$1" \
    -c unix_socket_directories="$WORK/pg" > "$WORK/log/postgres.log" 2>&1 &
  record_pid postgres $!
  wait_for 60 postgres env PGPASSWORD="$DB_PASSWORD" psql -h 127.0.0.1 -p "$1" -U postgres -c "select 1" || return 1
  PGPASSWORD="$DB_PASSWORD" psql -q -h 127.0.0.1 -p "$1" -U postgres \
    -c "create user mlflow password '$DB_PASSWORD'" -c "create database mlflow owner mlflow"
}

start_mlflow_server() {  # PG_PORT PORT
  mkdir -p "$WORK/mlartifacts"
  # psycopg2 named explicitly: SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3
  MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false setsid mlflow server \
    --backend-store-uri "postgresql+psycopg2://mlflow:$DB_PASSWORD@127.0.0.1:$1/mlflow" \
    --artifacts-destination "$WORK/mlartifacts" --host 127.0.0.1 --port "$2" --workers 2 \
    > "$WORK/log/mlflow-server.log" 2>&1 &
  record_pid mlflow-server $! group  # its uvicorn workers are in its process group
  wait_for 300 "mlflow server" curl -sf "http://127.0.0.1:$2/health"
}

# ---------------------------------------------------------------------------- stop

alive() { kill -0 "$1" 2>/dev/null; }

stop_one() {  # NAME PID [group]: SIGTERM (postgres: SIGINT, its fast shutdown), 60 s, then SIGKILL
  local name=$1 pid=$2 target=$2 sig=TERM
  [ "${3:-}" = group ] && target="-$pid"
  [ "$name" = postgres ] && sig=INT
  alive "$pid" || return 0
  kill -s "$sig" -- "$target" 2>/dev/null
  for _ in $(seq 1 60); do alive "$pid" || break; sleep 1; done
  if alive "$pid" || { [ "${3:-}" = group ] && pgrep -g "$pid" > /dev/null; }; then
    echo "$name ($pid) ignored SIG$sig for 60 s: SIGKILL" >&2
    kill -s KILL -- "$target" 2>/dev/null
    sleep 1
  fi
  wait "$pid" 2>/dev/null || true
}

stop_all() {  # every recorded process, newest first; prints what is still alive (nothing, normally)
  local name pid group left=""
  while read -r name pid group; do
    stop_one "$name" "$pid" "$group"
  done < <(tac "$PIDS_FILE")
  while read -r name pid group; do
    if alive "$pid" || { [ "$group" = group ] && pgrep -g "$pid" > /dev/null; }; then left="$left $name($pid)"; fi
  done < "$PIDS_FILE"
  echo "$left"
}
