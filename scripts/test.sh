#!/usr/bin/env bash
# Run kvcanary's test suite as CI does. A throwaway PostgreSQL server serves the database tests
# that run on both engines; GPU tests skip themselves, with the reason, on a machine without one.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
ruff check .
ruff format --check .
mypy service evals kernels
if [ -z "${KVCANARY_TEST_POSTGRES_URL:-}" ]; then
  eval "$(bash scripts/start_postgres.sh)"
  if [ -n "${KVCANARY_TEST_POSTGRES_DATA:-}" ]; then
    stop_pg() {
      local pg_ctl runas=()
      pg_ctl="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)/pg_ctl"
      [ "$(id -u)" = 0 ] && runas=(runuser -u postgres --)
      "${runas[@]}" "$pg_ctl" -D "$KVCANARY_TEST_POSTGRES_DATA" -m fast stop >/dev/null 2>&1 || true
    }
    trap stop_pg EXIT
  fi
fi
# Two xdist workers, each given whole test files (a file's engines and services stay in one
# process) in the order tests/conftest.py sorts them: an engine start or a Triton-interpreted
# kernel keeps one core busy, so two workers roughly halve the wall time on two cores.
python -m pytest -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder -rs --durations=30 "$@"
