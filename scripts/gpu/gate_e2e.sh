#!/usr/bin/env bash
# The accuracy gate end to end on a GPU host, through kvcanary itself (docs/gpu-gate.md).
#
#   scripts/gpu/gate_e2e.sh pack KIT_BUILDER OUTDIR   on a machine with PyPI: everything the host needs
#   scripts/gpu/gate_e2e.sh run  CARRIED OUTDIR [ROWS] on the GPU host (no network): set up, run, table
#   scripts/gpu/gate_e2e.sh calibrate CARRIED OUTDIR [REPEATS]  the same set-up, then the drift suite's
#                                                   calibration (scripts/gpu/drift_calibration.py;
#                                                   CALIBRATE_FIXTURES=a,b picks the drift fixtures)
#
# `pack` builds the offline vLLM 0.24.0 kit (KIT_BUILDER is the kit's build.sh), kvcanary's wheel
# with its server and suites extras and the wheels they need beyond the kit and the host's own
# packages (python 3.12; scripts/gpu/pack_wheels.py), and the
# fixtures that are built rather than committed (Whisper tiny.en converted to a transformers
# checkpoint, the 176 speech clips), cut into parts of FIXTURE_PART_BYTES (10 MB) so that
# they fit beside the kit's parts in transfers of limited size.
# `run` expects all of that in one folder CARRIED, laid out as `pack` wrote it (kit/part*/,
# kit/host/, kit/addon-fa3/, wheels/, fixtures/), installs it under /tmp, starts `kvcanary serve`,
# submits each gate run with `kvcanary submit --wait` and prints the result table. ROWS picks
# groups (default gsm8k,whisper,mla,legacy; also drift, invariance, aa: A/A repeats on fresh
# engines, ab5: five fresh fixed engines against stock per drift fixture, recall: the recall sweep on both
# retrieval fixtures (docs/recall.md), and mutants: the mutation matrix of both GPU fixtures, docs/mutants.md; GATE_MUTANTS=a,b
# picks mutants, GATE_MUTANT_FIXTURES=triton-attn-llama or triton-mla-480 one fixture; tp2 needs
# two GPUs). A trained MLA checkpoint that
# is not in the wheel yet can be given as MLA_MODEL_DIR.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

pack() {
  local builder=$1 out=$2
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  [ -d "$out/kit/part1" ] || bash "$builder" "$out/kit"
  local py=${PYTHON312:-python3.12}
  [ -x "$out/.py312/bin/python" ] || "$py" -m venv "$out/.py312"
  "$out/.py312/bin/python" -m pip install -q --upgrade pip
  "$out/.py312/bin/python" "$here/pack_wheels.py" "$repo" "$out" --python "$out/.py312/bin/python" \
    --have "$out/kit/.work/closure.json" --have "$(dirname "$builder")/host-packages.txt"
  local cache="$out/.fixtures"
  KVCANARY_CACHE_DIR="$cache" "$repo/.venv/bin/python" -c \
    "from evals import fixtures; [print(fixtures.resolve(f)) for f in ('fixture:whisper-tiny-en', 'fixture:speech-clips-varied')]"
  rm -f "$out"/fixtures/fixtures.tar.part* && mkdir -p "$out/fixtures"
  tar -C "$cache" -cf - whisper-tiny.en speech-clips-varied | split -b "${FIXTURE_PART_BYTES:-10000000}" - "$out/fixtures/fixtures.tar.part"
  du -sh "$out"/kit/part* "$out"/kit/host "$out"/kit/addon-fa3 "$out"/wheels "$out"/fixtures/* | sort -k2
}

setup() {
  local carried=$1 out=$2
  carried=$(cd "$carried" && pwd)
  mkdir -p "$out" && out=$(cd "$out" && pwd)
  bash "$carried/kit/host/setup.sh" "$carried/kit"
  rm -rf /tmp/kvc
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kvc "$carried"/wheels/*.whl
  if [ -n "${MLA_MODEL_DIR:-}" ]; then
    local mla=/tmp/kvc/evals/fixtures/data/gsm8k-tiny-mla
    rm -rf "$mla" && ln -s "$MLA_MODEL_DIR" "$mla"  # read when the MLA runs start: it may still be training
  fi
  export KVCANARY_CACHE_DIR=/tmp/kvc-fixtures KIT_PLUGIN_PATH=/tmp/kvc
  mkdir -p "$KVCANARY_CACHE_DIR"
  # Only the Whisper rows need the built fixtures; the drift and GSM8k rows use committed ones.
  if compgen -G "$carried/fixtures/fixtures.tar.part*" >/dev/null; then
    cat "$carried"/fixtures/fixtures.tar.part* | tar -C "$KVCANARY_CACHE_DIR" -xf -
  fi
  # shellcheck disable=SC1091
  source /tmp/bundle/kit-env.sh
  export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
}

run() {
  local out=$2 rows=${3:-gsm8k,whisper,mla,legacy}
  setup "$1" "$out"
  out=$(cd "$out" && pwd)
  cd "$out"  # nothing of the checkout may shadow the installed kvcanary
  python3 "$here/gate_e2e.py" --out "$out" --rows "$rows" --mutants "${GATE_MUTANTS:-}" --mutant-fixtures "${GATE_MUTANT_FIXTURES:-}" \
    --halves "${GATE_HALVES:-held-out,tuning}"
}

calibrate() {
  local out=$2 repeats=${3:-5}
  setup "$1" "$out"
  out=$(cd "$out" && pwd)
  cd "$out"
  python3 "$here/drift_calibration.py" --out "$out" --repeats "$repeats" --fixtures "${CALIBRATE_FIXTURES:-drift-tiny-gpu,drift-tiny-mla-gpu}"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  calibrate) shift; calibrate "$@" ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
