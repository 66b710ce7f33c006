#!/usr/bin/env bash
# Instructions a PostgreSQL backend spends per transaction of each pgbench script, counted by
# callgrind: deterministic where seconds on a shared machine are not (docs/benchmarks.md, "the
# speculative mode's database share, named").
#
#   benches/pgbench/instructions.sh benches/pgbench/hand_speculative.sql benches/pgbench/speculative.sql
#
# Starts a throwaway PostgreSQL 15 under `valgrind --tool=callgrind --trace-children=yes` (as the
# `postgres` user, on PORT, default 15434, in a temporary directory), creates the key table
# (migrations 0001 and 0003) and `tasks`, runs each script with one client for 100 and for 600
# transactions, and prints (the backend's instructions at 600 - at 100) / 500: one transaction
# without the connection's start. The same script run twice agrees within 1-2%; the figures drift
# up slowly as the tables grow, so compare scripts within one run. Stops the server at the end.
# Needs valgrind, pgbench and PostgreSQL 15's server binaries (scripts/services.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/../.."
(($#)) || { echo "usage: $0 SCRIPT.sql..." >&2; exit 2; }
port=${PORT:-15434}
bin=/usr/lib/postgresql/15/bin
dir=$(mktemp -d /tmp/pg-instructions.XXXXXX)
[ "$(id -un)" = postgres ] || chown postgres "$dir"
as_postgres() { if [ "$(id -un)" = postgres ]; then "$@"; else su postgres -s /bin/bash -c "$(printf '%q ' "$@")"; fi; }
stop() { as_postgres "$bin/pg_ctl" -D "$dir/data" -m fast stop >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap stop EXIT
as_postgres "$bin/initdb" -D "$dir/data" -A trust -U postgres >/dev/null
cat >> "$dir/data/postgresql.conf" <<EOF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
autovacuum = off
EOF
mkdir "$dir/cg"; [ "$(id -un)" = postgres ] || chown postgres "$dir/cg"
as_postgres bash -c "cd '$dir' && nohup valgrind --tool=callgrind --trace-children=yes \
  --callgrind-out-file='$dir/cg/cg.%p' '$bin/postgres' -D '$dir/data' > '$dir/log' 2>&1 &"
for _ in $(seq 120); do pg_isready -h 127.0.0.1 -p "$port" -q && break; sleep 1; done
pg_isready -h 127.0.0.1 -p "$port" -q || { echo "the server did not start: $dir/log" >&2; cat "$dir/log" >&2; exit 1; }
psql -h 127.0.0.1 -p "$port" -U postgres -qc "CREATE DATABASE idem_pgbench"
psql -h 127.0.0.1 -p "$port" -U postgres -d idem_pgbench -q -v ON_ERROR_STOP=1 \
  -f migrations/0001_create_idempotency_keys.sql -f migrations/0003_tune_autovacuum.sql \
  -f migrations/0004_wake_waiting_duplicates.sql \
  -c "CREATE TABLE tasks (id bigserial PRIMARY KEY, title text NOT NULL)"

# The instructions of the backend that ran N transactions of SCRIPT (the largest new profile:
# the connection's backend; forks before it are small).
backend() {
  local before new
  before=$(ls "$dir/cg")
  pgbench -h 127.0.0.1 -p "$port" -U postgres -n -M prepared -c 1 -t "$2" -f "$1" idem_pgbench \
    > "$dir/pgbench.log" 2>&1 || { cat "$dir/pgbench.log" >&2; return 1; }
  sleep 2 # the backend writes its profile when it exits
  new=$(comm -13 <(echo "$before") <(ls "$dir/cg") | while read -r f; do
    echo "$(stat -c %s "$dir/cg/$f") $f"; done | sort -n | tail -1 | cut -d' ' -f2)
  grep -m1 '^summary:\|^totals:' "$dir/cg/$new" | awk '{print $2}'
}

printf '| script | instructions per transaction |\n| --- | ---: |\n'
for script in "$@"; do
  short=$(backend "$script" 100)
  long=$(backend "$script" 600)
  printf '| %s | %d |\n' "$(basename "$script")" $(((long - short) / 500))
done
