#!/usr/bin/env bash
# The W4A16 grouped GEMM alone on the GPU machine, in one device call (~4 min): builds its tests and
# bench_w4a16, runs test_wgmma_layout_host, test_cuda_w4a16_host, test_cuda_w4a16_configs_host and test_cuda_w4a16 (every config
# against the f64 reference), compute-sanitizer memcheck + racecheck on the every-config cases, and
# bench_w4a16 (cuBLAS BF16 peer in the same process) on GLM-5's dense Linears at 16 / 64 tokens and on
# the expert shard at 16..512 tokens per expert. Logs: $OUT/logs-gpu_w4a16_check.tgz.
# Prepare here: scripts/device_prepare.sh; device call: carry [".carry", "third_party"],
# command `bash scripts/gpu_w4a16_check.sh`.
#   FP4MOE_STAGES  which of "tests sanitizer bench" to run (default all)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
status=0
stages=" ${FP4MOE_STAGES:-tests sanitizer bench} "
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

step "build"
gpu_configure build-gpu || exit 1
cmake --build build-gpu -j "$(nproc)" --target test_cuda_w4a16 test_cuda_w4a16_host test_cuda_w4a16_configs_host test_wgmma_layout_host bench_w4a16 \
  -- -k 0 > "$out/build.log" 2>&1 || { status=1; grep -E "^FAILED|error" "$out/build.log" | head -20; }
test_bin() { find build-gpu/tests -name "$1" -type f -perm -u+x | head -1; }

if has tests; then
  step "tests"
  for name in test_wgmma_layout_host test_cuda_w4a16_host test_cuda_w4a16_configs_host test_cuda_w4a16; do
    t=$(test_bin "$name")
    [ -n "$t" ] || { echo "$name: not built"; status=1; continue; }
    if timeout 300 "$t" > "$out/$name.log" 2>&1; then r=ok; else r=FAILED; status=1; fi
    echo "$name: $r ($(grep -c '^\[       OK' "$out/$name.log") ok)"
    grep -E "Failure|FAILED  \]|rror" "$out/$name.log" | head -30
  done
fi

if has sanitizer; then
  step "compute-sanitizer (every config: ragged problem, K = 16 x odd)"
  t=$(test_bin test_cuda_w4a16)
  for tool in memcheck racecheck; do
    if timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 9 "$t" \
        --gtest_filter='W4A16Gpu.EveryConfigOnARaggedProblem:W4A16Gpu.KSixteenTimesOdd' > "$out/sanitizer_$tool.log" 2>&1; then
      echo "$tool test_cuda_w4a16: clean ($(grep -c '^\[       OK' "$out/sanitizer_$tool.log") tests)"
    else
      echo "$tool test_cuda_w4a16: FAILED"; tail -30 "$out/sanitizer_$tool.log"; status=1
    fi
  done
fi

if has bench; then
  step "bench_w4a16: dense E = 1 Linears of GLM-5 (o_proj, q_b, q_a, dense MLP)"
  build-gpu/bench/bench_w4a16 --runs 20 --tokens 16,64 --shape 1,6144,16384 --shape 1,16384,2048 --shape 1,2048,6144 \
    --shape 1,12288,6144 --shape 1,6144,12288 2>&1 | tee "$out/bench_dense.txt" || status=1
  step "bench_w4a16: GLM-5 expert shard (E = 32), decode to prefill"
  build-gpu/bench/bench_w4a16 --runs 20 --tokens 16,64,128,256,512 2>&1 | tee "$out/bench_shard.txt" || status=1
fi
step "done (status $status)"
exit $status
