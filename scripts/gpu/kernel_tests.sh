#!/usr/bin/env bash
# Benchmark and kernel tests on a GPU host, in one go (compiled Triton, no interpreter).
#   scripts/gpu/kernel_tests.sh [--all] [--vllm-ref DIR] [--sweep | --smoke]
# First scripts/gpu/bench_kernels.py (with the remaining arguments; its table lands in
# $OUT or .), then the tests marked gpu under tests/kernels (real sizes: Kimi-Linear MLA page
# ids past 7,767, Whisper-like cross-attention over NaN block tails), or every kernel test
# with --all. Only the kernel tests' conftest is loaded, so the GPU host needs torch, triton
# and pytest, nothing else of the project's dependencies.
set -uo pipefail
cd "$(dirname "$0")/../.."
selection=(-m gpu)
if [[ "${1:-}" == "--all" ]]; then
  selection=()
  shift
fi
out="${OUT:-.}"
PYTHONUNBUFFERED=1 python3 scripts/gpu/bench_kernels.py --out "$out" "$@" 2>&1 | tee "$out/bench.log"
bench_rc=${PIPESTATUS[0]}
xdist=()
python3 -c "import xdist" 2>/dev/null && xdist=(-n 4)
# The plugin's engine tests need the service's dependencies and a vLLM server: CI runs them.
python3 -m pytest tests/kernels "${selection[@]}" "${xdist[@]}" -q -rfEs -p no:cacheprovider \
  --ignore=tests/kernels/test_vllm_plugin_engine.py \
  --confcutdir=tests/kernels -o addopts= 2>&1 | tee "$out/kernel_tests.log"
tests_rc=${PIPESTATUS[0]}
echo "benchmark exit ${bench_rc}, kernel tests exit ${tests_rc}"
cat "$out/bench.txt" 2>/dev/null
exit $(( tests_rc != 0 || bench_rc != 0 ))
