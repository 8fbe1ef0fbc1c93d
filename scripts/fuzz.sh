#!/usr/bin/env bash
# Runs every libFuzzer target (fuzz/*_fuzz.cpp) for SECONDS each (default 60).
#
#   scripts/fuzz.sh [SECONDS]
#
# Builds in its own directory (build-fuzz, or $FUZZ_BUILD) with clang, the CPU backend only,
# and every library instrumented for libFuzzer + ASan + UBSan. Each target X_fuzz starts
# from the seeds in fuzz/corpus/X/ (committed, small) and uses fuzz/X_fuzz.dict when present;
# what it discovers goes to $FUZZ_BUILD/corpus/X/, never into the source tree. Crash inputs
# land in $FUZZ_BUILD/crashes/X/. Not part of `make test`.
set -euo pipefail

SECONDS_PER_TARGET="${1:-60}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${FUZZ_BUILD:-$ROOT/build-fuzz}"
JOBS="${JOBS:-$(nproc)}"
CC_BIN="${CC:-clang}"
CXX_BIN="${CXX:-clang++}"
# libFuzzer needs clang: a CC/CXX pointing at gcc (a common default) is ignored.
[[ "$CC_BIN" == *gcc* ]] && CC_BIN=clang
[[ "$CXX_BIN" == *g++* ]] && CXX_BIN=clang++
command -v "$CXX_BIN" >/dev/null || { echo "fuzz.sh: $CXX_BIN not found (install clang)" >&2; exit 2; }

SAN_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
if [[ ! -f "$BUILD/build.ninja" ]]; then
  CC="$CC_BIN" CXX="$CXX_BIN" cmake -S "$ROOT" -B "$BUILD" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMOONRUN_FUZZ=ON -DMOONRUN_CUDA=OFF \
    -DCMAKE_C_FLAGS="$SAN_FLAGS" -DCMAKE_CXX_FLAGS="$SAN_FLAGS"
fi

targets=()
for src in "$ROOT"/fuzz/*_fuzz.cpp; do
  [[ -e "$src" ]] || continue
  targets+=("$(basename "$src" .cpp)")
done
if [[ ${#targets[@]} -eq 0 ]]; then
  echo "fuzz.sh: no fuzz/*_fuzz.cpp targets" >&2
  exit 2
fi
# A new *_fuzz.cpp needs a re-glob; cmake re-runs itself when the glob changes.
cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=()
for t in "${targets[@]}"; do
  name="${t%_fuzz}"
  corpus="$BUILD/corpus/$name"
  crashes="$BUILD/crashes/$name"
  mkdir -p "$corpus" "$crashes"
  if [[ -d "$ROOT/fuzz/corpus/$name" ]]; then
    cp -n "$ROOT/fuzz/corpus/$name"/* "$corpus"/ 2>/dev/null || true
  fi
  args=(-max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048
        -artifact_prefix="$crashes/" -print_final_stats=1)
  [[ -f "$ROOT/fuzz/$t.dict" ]] && args+=(-dict="$ROOT/fuzz/$t.dict")
  echo "== $t: ${SECONDS_PER_TARGET}s, corpus $corpus"
  if ! "$BUILD/fuzz/$t" "${args[@]}" "$corpus" 2>"$BUILD/$t.log"; then
    echo "!! $t FAILED: see $BUILD/$t.log and $crashes/" >&2
    tail -40 "$BUILD/$t.log" >&2
    failed+=("$t")
  else
    grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|Done)" "$BUILD/$t.log" || true
    echo "ok $t"
  fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz.sh: ${#failed[@]} target(s) failed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: all ${#targets[@]} target(s) clean for ${SECONDS_PER_TARGET}s each"
