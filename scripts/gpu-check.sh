#!/usr/bin/env bash
# Every GPU test and benchmark in one call, for a Hopper machine (H100/H200). Builds with
# CUDA (unless a build folder is carried in), runs the CUDA op tests against the CPU
# reference, the model fixtures and the e2e tests, and prints a summary table last.
#   scripts/gpu-check.sh [build-dir]
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
OUT=${OUT:-$BUILD/gpu-check-out}
mkdir -p "$OUT"
declare -a rows

row() { rows+=("$(printf '%-28s %-6s %s' "$1" "$2" "$3")"); }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

if [[ ! -f $BUILD/build.ninja ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DMOONRUN_CUDA=ON >"$OUT/configure.log" 2>&1 || { echo "configure failed"; tail -30 "$OUT/configure.log"; exit 1; }
fi
if cmake --build "$BUILD" -j "$(nproc)" >"$OUT/build.log" 2>&1; then row build ok "$BUILD"; else row build FAIL "see build.log"; tail -40 "$OUT/build.log"; fi

if [[ -x $BUILD/tests/moonrun_ops_tests ]]; then
  if "$BUILD/tests/moonrun_ops_tests" >"$OUT/ops.log" 2>&1; then r=ok; else r=FAIL; fi
  row "CUDA op tests" "$r" "$(grep -E '^\[  (PASSED|FAILED)' "$OUT/ops.log" | tr '\n' ' ')"
else
  row "CUDA op tests" skip "no CUDA ops in this build yet"
fi

if [[ -x $BUILD/tests/moonrun_model_tests ]]; then
  if "$BUILD/tests/moonrun_model_tests" >"$OUT/model.log" 2>&1; then r=ok; else r=FAIL; fi
  row "model fixtures (cpu)" "$r" "$(grep -E '^\[  (PASSED|FAILED)' "$OUT/model.log" | tr '\n' ' ')"
fi

echo
echo "== gpu-check summary ($(date -u +%F\ %H:%M) UTC, $(head -1 "$OUT/gpu.txt"))"
printf '%s\n' "${rows[@]}"
