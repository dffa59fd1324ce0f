#!/usr/bin/env bash
# Nsight Compute on chosen W4A16 launches, one device call: builds bench_w4a16 (+ test_cuda_w4a16 for
# the optional racecheck), then per spec "E,N,K:TOKENS:REGEX" profiles the first timed launch of the
# kernel whose demangled name matches REGEX in `bench_w4a16 --shape E,N,K --tokens TOKENS --runs 1`
# (bench_w4a16 times every shipped config: 5 warm-ups + 1 run each, so --launch-skip 5). Prints the
# speed-of-light, warp-state, memory and compute sections and every stall reason per issued instruction.
#   usage (device command): bash scripts/gpu_ncu.sh '32,4096,6144:256:wgmma_kernel<128u, 256u, 4u' ...
#   FP4MOE_RACECHECK_FILTER  gtest filter for a compute-sanitizer racecheck of test_cuda_w4a16 first
#   FP4MOE_NCU_METRICS more metrics (comma-separated; ncu takes one --metrics), e.g. the opcode mix and the
#                    pipes' shares of issue: 'sass__inst_executed_per_opcode,regex:sm__inst_executed_pipe_.*'
#   FP4MOE_NCU_ARGS  more ncu arguments, e.g. '--print-metric-instances values' (InstructionStats is always on)
# Reports: $OUT/logs-gpu_ncu.tgz (ncu-<n>.txt per spec).
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
status=0
step "build"
gpu_configure build-prof || exit 1
cmake --build build-prof -j "$(nproc)" --target bench_w4a16 test_cuda_w4a16 > "$out/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$out/build.log" | head -30; exit 1; }
if [ -n "${FP4MOE_RACECHECK_FILTER:-}" ]; then
  step "racecheck test_cuda_w4a16 --gtest_filter=$FP4MOE_RACECHECK_FILTER"
  t=$(find build-prof/tests -name test_cuda_w4a16 -type f | head -1)
  if timeout 300 compute-sanitizer --tool racecheck --error-exitcode 9 "$t" --gtest_filter="$FP4MOE_RACECHECK_FILTER" \
      > "$out/racecheck.log" 2>&1; then
    echo "racecheck: clean ($(grep -c '^\[       OK' "$out/racecheck.log") tests)"
  else
    echo "racecheck: FAILED"; grep -E "hazard|Error|FAILED" "$out/racecheck.log" | head -20; status=1
  fi
fi
n=0
for spec in "$@"; do
  n=$((n + 1))
  IFS=: read -r shape tokens regex <<< "$spec"
  step "ncu [$n] shape $shape, $tokens tokens/expert, kernel ~ /$regex/"
  timeout 240 ncu --clock-control none --kernel-name-base demangled -k "regex:$regex" --launch-skip 5 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --section Occupancy --section InstructionStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio${FP4MOE_NCU_METRICS:+,$FP4MOE_NCU_METRICS}" \
    ${FP4MOE_NCU_ARGS:-} \
    build-prof/bench/bench_w4a16 --shape "$shape" --tokens "$tokens" --runs 1 > "$out/ncu-$n.txt" 2>&1 || status=1
  grep -vE "^==PROF==|^bench_w4a16|^shape|^gate_up|^down|^HBM|^ *----" "$out/ncu-$n.txt" |
    grep -vE "stalled_.*ratio +(inst|) *0(\.0+)?$" | head -250
done
step "done (status $status)"
exit $status
