#!/usr/bin/env bash
# Run kvcanary's test suite as CI does (GPU tests skip themselves, with the reason, without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
ruff check .
mypy service evals kernels
exec python -m pytest -p no:cacheprovider -rs "$@"
