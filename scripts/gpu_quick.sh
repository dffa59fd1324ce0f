#!/usr/bin/env bash
# After a kernel change, in one device call: the full test suite (gpu_check.sh's tests stage), the
# sanitizers on the named test binaries, then the decode numbers that change: bench_w4a16 at decode
# sizes, `fp4moe bench moe`, and glm5-shard bench-one-batch with the BF16 peer, all logged to $OUT.
#   FP4MOE_SANITIZE  test binaries for compute-sanitizer (default test_cuda_w4a16; "" for none)
#   FP4MOE_BATCHES   bench-one-batch batch sizes (default 64,256)
#   FP4MOE_QUICK     which of "tests sanitizer w4a16 moe step" to run (default all)
# Device call: carry [".carry", "third_party"], command `bash scripts/gpu_quick.sh`.
set -uo pipefail
here="$(dirname "$0")"
source "$here/device_env.sh"
quick=" ${FP4MOE_QUICK:-tests sanitizer w4a16 moe step} "
status=0
stages="build "  # gpu_check.sh always builds; an unknown stage name runs nothing after the build
[[ "$quick" == *" tests "* ]] && stages+="tests "
[[ "$quick" == *" sanitizer "* ]] && stages+="sanitizer "
FP4MOE_STAGES="$stages" FP4MOE_SANITIZE="${FP4MOE_SANITIZE-test_cuda_w4a16}" bash "$here/gpu_check.sh" || status=1
fp4moe=build-gpu/fp4moe
if [[ "$quick" == *" w4a16 "* ]]; then
  step "bench_w4a16 at decode sizes"
  build-gpu/bench/bench_w4a16 --runs 20 --tokens 1,2,4,8,16 2>&1 | tee "$out/bench_w4a16.txt" || status=1
fi
if [[ "$quick" == *" moe "* ]]; then
  step "fp4moe bench moe"
  timeout 180 "$fp4moe" bench moe --iters 10 --warmup 3 2>&1 | tee "$out/bench_moe.txt" || status=1
fi
if [[ "$quick" == *" step "* ]]; then
  for peer in "" --bf16-peer; do
    step "glm5-shard bench-one-batch ${peer:-(NVFP4)}"
    timeout 200 "$fp4moe" bench-one-batch --device cuda --model glm5-shard --load-format dummy --dummy-weights nvfp4 \
      $peer --batch-size "${FP4MOE_BATCHES:-64,256}" --input-len 1024 --output-len 8 --breakdown 2>&1 \
      | tee -a "$out/bench_one_batch.txt" | grep -vE "^\[|loading|load " | tail -12 || status=1
  done
fi
step "done (status $status)"
exit $status
