#!/usr/bin/env bash
# Makes sure the servers the tests use are installed and running on loopback:
# PostgreSQL (127.0.0.1:5432, user postgres, trust auth) with the pg_cron package available, and
# Redis (127.0.0.1:6379). On this project's machines they are already running and this script only
# checks; on a fresh Debian machine (as root) it installs and starts them.
# Tests that kill or reconfigure a server start their own throwaway servers; this script never
# stops anything.
set -euo pipefail

log() { printf '[services] %s\n' "$*" >&2; }

apt_updated=0
apt_install() {
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    log "missing packages: $*; install them (Debian: apt-get install $*) and run again"
    exit 1
  fi
  if [ "$apt_updated" -eq 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    apt_updated=1
  fi
  log "installing $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

pg_bin_dir() {
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

# --- PostgreSQL ---------------------------------------------------------------------------
if [ -z "$(pg_bin_dir)" ]; then
  apt_install postgresql
fi
PG_BIN=$(pg_bin_dir)
PG_MAJOR=$(basename "$(dirname "$PG_BIN")")
if [ ! -f "/usr/lib/postgresql/$PG_MAJOR/lib/pg_cron.so" ]; then
  apt_install "postgresql-$PG_MAJOR-cron"
fi
# Throwaway servers run as the postgres user through setpriv, and are signalled with kill.
command -v setpriv >/dev/null || apt_install util-linux
[ -x /bin/kill ] || [ -x /usr/bin/kill ] || apt_install procps

if ! "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p 5432; then
  if command -v pg_ctlcluster >/dev/null; then
    if ! pg_lsclusters -h 2>/dev/null | awk '{print $1" "$2}' | grep -q "^$PG_MAJOR main$"; then
      log "creating PostgreSQL cluster $PG_MAJOR/main"
      pg_createcluster "$PG_MAJOR" main >/dev/null
    fi
    hba="/etc/postgresql/$PG_MAJOR/main/pg_hba.conf"
    if [ -f "$hba" ] && ! grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
      log "allowing trust auth on 127.0.0.1 for the test server"
      sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
    fi
    log "starting PostgreSQL $PG_MAJOR"
    pg_ctlcluster --skip-systemctl-redirect "$PG_MAJOR" main start
  else
    log "PostgreSQL is not running on 127.0.0.1:5432 and pg_ctlcluster is missing; start it by hand"
    exit 1
  fi
  for _ in $(seq 1 30); do
    "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p 5432 && break
    sleep 1
  done
fi
"$PG_BIN/pg_isready" -h 127.0.0.1 -p 5432 >/dev/null || { log "PostgreSQL did not come up"; exit 1; }

# --- Redis --------------------------------------------------------------------------------
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  apt_install redis-server redis-tools
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  log "starting Redis on 127.0.0.1:6379"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 1 30); do
    redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break
    sleep 1
  done
fi
redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null || { log "Redis did not come up"; exit 1; }
log "PostgreSQL $PG_MAJOR and Redis are up on loopback"
