#!/usr/bin/env bash
# Regenerate constraints.txt from a working .venv (scripts/setup.sh, then the test suite green):
# every installed package at its version, minus kvcanary itself. The +cpu local label is dropped
# so the pin also matches the plain torch wheel of the same version.
set -euo pipefail
cd "$(dirname "$0")/.."
{
  echo "# Versions CI installs (pip install -c constraints.txt ...); regenerate with scripts/update_constraints.sh."
  .venv/bin/python -m pip freeze --exclude-editable --exclude kvcanary | sed -E 's/\+cpu$//' | LC_ALL=C sort -f
} > constraints.txt
