#!/usr/bin/env bash
# Makes sure the servers and tools the tests use are there:
#   - PostgreSQL at IDEMPOTENCY_TEST_POSTGRES_URL (default postgres://postgres@127.0.0.1:5432/postgres)
#   - Redis at IDEMPOTENCY_TEST_REDIS_URL (default redis://127.0.0.1:6379)
#   - RabbitMQ at IDEMPOTENCY_TEST_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/%2f), for
#     the idempotent-consumer tests
#   - for the tests that start throwaway servers: PostgreSQL's server binaries with pg_cron,
#     pgbouncer, redis-server and redis-cli, psql and pg_dump, setpriv;
#   - promtool (Debian's prometheus package; this script does not start its server), for the tests of the
#     shipped alerting rules.
#
# It first checks. If everything answers, it changes nothing. Only when something is missing, and
# only with CI set (the CI machine) or `--install` given, it installs Debian packages (as root)
# and starts a stopped server. It never edits the configuration of an existing PostgreSQL cluster
# (pg_hba.conf is yours): a cluster it creates itself gets trust on 127.0.0.1 at creation.
# Tests that kill or reconfigure a server start their own throwaway servers; this script never
# stops anything.
set -euo pipefail

log() { printf '[services] %s\n' "$*" >&2; }

install=0
[ -n "${CI:-}" ] && install=1
for arg in "$@"; do
  case "$arg" in
    --install) install=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) log "unknown argument $arg (use --install)"; exit 2 ;;
  esac
done

PG_URL="${IDEMPOTENCY_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
REDIS_URL="${IDEMPOTENCY_TEST_REDIS_URL:-redis://127.0.0.1:6379}"
AMQP_URL="${IDEMPOTENCY_TEST_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}"

missing=()
need() { missing+=("$1: $2"); }

apt_updated=0
apt_install() {
  if [ "$install" -eq 0 ]; then
    need "packages" "$*"
    return 1
  fi
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

# --- Tools and packages the throwaway servers need ------------------------------------------
[ -n "$(pg_bin_dir)" ] || apt_install postgresql || true
PG_BIN=$(pg_bin_dir)
PG_MAJOR=""
if [ -n "$PG_BIN" ]; then
  PG_MAJOR=$(basename "$(dirname "$PG_BIN")")
  [ -f "/usr/lib/postgresql/$PG_MAJOR/lib/pg_cron.so" ] || apt_install "postgresql-$PG_MAJOR-cron" || true
fi
command -v psql >/dev/null && command -v pg_dump >/dev/null || apt_install postgresql-client || true
command -v pgbouncer >/dev/null || apt_install pgbouncer || true
command -v promtool >/dev/null || apt_install --no-install-recommends prometheus || true
command -v setpriv >/dev/null || apt_install util-linux || true
[ -x /bin/kill ] || [ -x /usr/bin/kill ] || apt_install procps || true
{ command -v redis-server >/dev/null && command -v redis-cli >/dev/null; } || apt_install redis-server redis-tools || true

# --- PostgreSQL at the configured URL -------------------------------------------------------
pg_answers() { command -v psql >/dev/null && psql "$PG_URL" -qAtc 'SELECT 1' >/dev/null 2>&1; }
if ! pg_answers; then
  if [ "$install" -eq 1 ] && [ -n "$PG_MAJOR" ] && command -v pg_ctlcluster >/dev/null \
     && [[ "$PG_URL" == *"127.0.0.1:5432"* ]]; then
    if ! pg_lsclusters -h 2>/dev/null | awk '{print $1" "$2}' | grep -q "^$PG_MAJOR main$"; then
      log "creating PostgreSQL cluster $PG_MAJOR/main (trust on 127.0.0.1, for tests only)"
      pg_createcluster "$PG_MAJOR" main -- --auth-host=trust --auth-local=trust >/dev/null
    fi
    log "starting PostgreSQL $PG_MAJOR"
    pg_ctlcluster --skip-systemctl-redirect "$PG_MAJOR" main start || true
    for _ in $(seq 1 30); do pg_answers && break; sleep 1; done
  fi
  pg_answers || need "PostgreSQL" "nothing answers at $PG_URL: start a server there (Debian: pg_ctlcluster ${PG_MAJOR:-<version>} main start) or point IDEMPOTENCY_TEST_POSTGRES_URL at one; with --install this script creates and starts a local test cluster"
fi

# --- Redis at the configured URL ------------------------------------------------------------
redis_answers() { command -v redis-cli >/dev/null && redis-cli -u "$REDIS_URL" ping 2>/dev/null | grep -q PONG; }
if ! redis_answers; then
  if [ "$install" -eq 1 ] && [[ "$REDIS_URL" == "redis://127.0.0.1:6379"* ]] && command -v redis-server >/dev/null; then
    log "starting Redis on 127.0.0.1:6379 (persistence off, for tests only)"
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log
    for _ in $(seq 1 30); do redis_answers && break; sleep 1; done
  fi
  redis_answers || need "Redis" "nothing answers at $REDIS_URL: start one (redis-server --port 6379 --save '' --appendonly no) or point IDEMPOTENCY_TEST_REDIS_URL at one; with --install this script starts a local test server"
fi

# --- RabbitMQ at the configured URL ---------------------------------------------------------
# host:port of the URL (after any user:password@, before the vhost).
amqp_hostport=${AMQP_URL#*://}
amqp_hostport=${amqp_hostport##*@}
amqp_hostport=${amqp_hostport%%/*}
amqp_host=${amqp_hostport%:*}
amqp_port=${amqp_hostport##*:}
[ "$amqp_port" = "$amqp_hostport" ] && amqp_port=5672
# A TCP connect, then the broker's AMQP greeting: it answers a protocol header with its own.
amqp_answers() {
  timeout 5 bash -c "exec 3<>/dev/tcp/$amqp_host/$amqp_port && printf 'AMQP\0\0\11\1' >&3 && head -c 4 <&3" 2>/dev/null | grep -q .
}
if ! amqp_answers; then
  if [ "$install" -eq 1 ] && [ "$amqp_hostport" = "127.0.0.1:5672" ]; then
    command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server || true
    if command -v rabbitmq-server >/dev/null; then
      log "starting RabbitMQ on 127.0.0.1:5672 (guest/guest, for tests only)"
      RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 rabbitmq-server -detached >/dev/null 2>&1 || true
      for _ in $(seq 1 60); do amqp_answers && break; sleep 1; done
    fi
  fi
  amqp_answers || need "RabbitMQ" "nothing answers at $amqp_hostport: start a broker (Debian: apt-get install rabbitmq-server; rabbitmq-server -detached) or point IDEMPOTENCY_TEST_AMQP_URL at one; with --install this script installs and starts one"
fi

if [ "${#missing[@]}" -gt 0 ]; then
  log "not ready:"
  for m in "${missing[@]}"; do log "  - $m"; done
  log "run with --install (or CI=true) to install packages and start local test servers"
  exit 1
fi
log "PostgreSQL ($PG_URL), Redis ($REDIS_URL) and RabbitMQ ($amqp_hostport) answer; the tools for throwaway servers are installed"
