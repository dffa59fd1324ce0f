#!/usr/bin/env bash
# Kernel iteration on the GPU machine (one device call): builds only the W4A16 GPU test and
# benchmark, runs the test (FP4MOE_GTEST_FILTER narrows it), the benchmark, and optionally Nsight
# Compute on chosen launches of the benchmark. Usage (device command):
#   bash scripts/gpu_profile.sh [bench args] -- [ncu args]
# e.g. bash scripts/gpu_profile.sh --tokens 1 --runs 1 -- --launch-skip 18 --launch-count 1
# (bench_w4a16 times every shipped config in kW4A16Configs order, 5 warm-ups + --runs launches each,
# so launch 6*i is config i's first launch with --runs 1). Reports: $OUT/logs-gpu_profile.tgz.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
bench_args=() ncu_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do bench_args+=("$1"); shift; done
[ $# -gt 0 ] && shift
ncu_args=("$@")
gpu_configure build-prof || exit 1
cmake --build build-prof -j "$(nproc)" --target bench_w4a16 test_cuda_w4a16 > "$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -30; exit 1; }
t=$(find build-prof/tests -name test_cuda_w4a16 -type f | head -1)
FP4MOE_SHARED="$PWD/.carry/shared" timeout "${FP4MOE_TEST_TIMEOUT:-240}" "$t" --gtest_filter="${FP4MOE_GTEST_FILTER:-*}" > "$out/test.log" 2>&1
echo "test_cuda_w4a16 exit $?"; grep -E "^\[  (FAILED|PASSED) |Failure|NMSE" "$out/test.log" | head -40
build-prof/bench/bench_w4a16 "${bench_args[@]}" | tee "$out/bench.txt"
if [ ${#ncu_args[@]} -gt 0 ]; then
  ncu --clock-control none -k regex:sm90_nvfp4 "${ncu_args[@]}" build-prof/bench/bench_w4a16 "${bench_args[@]}" > "$out/ncu.txt" 2>&1
  grep -vE "^==PROF==|^bench_w4a16|^shape|^gate_up|^down|^HBM" "$out/ncu.txt" | head -250
fi
