#!/usr/bin/env bash
# Runs a libFuzzer binary for a bounded time (CTest's fuzz_* tests call this).
#   usage: fuzz/run_bounded.sh <fuzzer> <work corpus dir> <seed corpus dir> <dict> <artifact dir>
# Time: $FP4MOE_FUZZ_SECONDS (default 60). New inputs go to the work dir (in the build tree), never
# to the committed seed corpus; a crash input is written to the artifact dir and fails the test.
set -euo pipefail
fuzzer=$1 work=$2 seeds=$3 dict=$4 artifacts=$5
seconds=${FP4MOE_FUZZ_SECONDS:-60}
mkdir -p "$work" "$artifacts"
exec "$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
  -dict="$dict" -artifact_prefix="$artifacts/" "$work" "$seeds"
