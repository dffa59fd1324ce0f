#!/usr/bin/env bash
# The whole test suite: set up (idempotent), build, run every CTest test.
#   usage: scripts/test.sh [extra ctest args]      e.g. scripts/test.sh -L cpu
# GPU tests (label "gpu") skip with the reason when no GPU is visible; the libFuzzer target runs
# for FP4MOE_FUZZ_SECONDS (default 60) when clang is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=${FP4MOE_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DFP4MOE_FUZZ=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
./build/fp4moe version
ctest --test-dir build --output-on-failure -j "$jobs" "$@"
