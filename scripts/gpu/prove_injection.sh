#!/usr/bin/env bash
# Prove kvcanary's kernel injection on a GPU host with the offline vLLM 0.24.0 kit.
#
# usage: scripts/gpu/prove_injection.sh KIT_HOST_DIR PARTS_DIR WHISPER_TOKENIZER_DIR OUT_DIR [ARGS...]
#   KIT_HOST_DIR           the kit's host/ folder (setup.sh, SHA256SUMS, ...)
#   PARTS_DIR              where the bundle parts and the FA3 add-on were copied (MLA needs FA3)
#   WHISPER_TOKENIZER_DIR  a Whisper checkpoint's tokenizer/feature-extractor files + config.json
#   OUT_DIR                records.json and logs.tar.gz land here; the result table goes to stdout
#   ARGS                   passed to prove_injection.py (--parallel N, --only RUNS, --smoke)
# vLLM finds the plugin through a throwaway dist-info on PYTHONPATH: nothing is pip-installed.
set -euo pipefail
[ $# -ge 4 ] || { sed -n '3,10p' "$0" >&2; exit 2; }
KIT_HOST=$1 PARTS=$2 WHISPER_TOK=$3 OUT=$4
shift 4
REPO=$(cd "$(dirname "$0")/../.." && pwd)

bash "$KIT_HOST/setup.sh" "$PARTS"

plugin_dir=$(mktemp -d)
mkdir "$plugin_dir/kvcanary_plugin-0.dist-info"
printf 'Metadata-Version: 2.1\nName: kvcanary-plugin\nVersion: 0\n' \
  > "$plugin_dir/kvcanary_plugin-0.dist-info/METADATA"
printf '[vllm.general_plugins]\nkvcanary = kernels.vllm_plugin:register\n' \
  > "$plugin_dir/kvcanary_plugin-0.dist-info/entry_points.txt"
export KIT_PLUGIN_PATH="$plugin_dir:$REPO"
# shellcheck disable=SC1091
source /tmp/bundle/kit-env.sh
export PYTHONUNBUFFERED=1

python3 - <<'PY'
import importlib.metadata as m, torch, vllm
print("vllm", vllm.__version__, "| torch", torch.__version__, "|", torch.cuda.get_device_name())
print("plugins:", [e.value for e in m.entry_points(group="vllm.general_plugins")])
PY
python3 "$REPO/scripts/gpu/prove_injection.py" --out "$OUT" --whisper-tokenizer "$WHISPER_TOK" "$@"
