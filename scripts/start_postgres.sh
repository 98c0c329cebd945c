#!/usr/bin/env bash
# Start a throwaway PostgreSQL server on 127.0.0.1 for the test suite and print its URL.
# Usage: eval "$(scripts/start_postgres.sh)"  -> exports KVCANARY_TEST_POSTGRES_URL
set -euo pipefail
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
if [ -z "$PGBIN" ]; then
  echo "echo 'PostgreSQL is not installed: PostgreSQL-backed tests will skip' >&2"
  exit 0
fi
PORT=${KVCANARY_TEST_POSTGRES_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
DATA=$(mktemp -d /tmp/kvcanary-pg.XXXXXX)
RUNAS=()
if [ "$(id -u)" = 0 ]; then
  chown postgres "$DATA"
  RUNAS=(runuser -u postgres --)
fi
"${RUNAS[@]}" "$PGBIN/initdb" -D "$DATA" -A trust -U kvcanary >/dev/null
"${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w \
  -o "-k $DATA -p $PORT -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off" start >/dev/null
echo "export KVCANARY_TEST_POSTGRES_URL=postgresql+psycopg://kvcanary@127.0.0.1:$PORT/postgres"
echo "export KVCANARY_TEST_POSTGRES_DATA=$DATA"
