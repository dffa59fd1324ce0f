#!/usr/bin/env bash
# One device call: builds fp4moe and the bench-moe GPU test, runs the test, autotunes the GLM-5
# shard GEMM shapes into a fresh cache, then times `fp4moe bench gemm` (which reads the cache and
# prints tuned/default per row) and `fp4moe bench moe --tuned` on the shard. Logs: $OUT/logs-gpu_tune_check.tgz.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
export FP4MOE_TUNE_CACHE="$out/tune.json"
gpu_configure build-gpu || exit 1
cmake --build build-gpu -j "$(nproc)" --target fp4moe test_bench_moe_gpu > "$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head; exit 1; }
"$(find build-gpu/tests -name test_bench_moe_gpu -type f | head -1)" 2>&1 | tail -3
shapes=32,4096,6144,32,6144,2048
build-gpu/fp4moe tune --shape $shapes --tokens 1,2,4,8,16,32,64,128 2>&1 | tee "$out/tune.txt" | tail -40
build-gpu/fp4moe bench gemm --shape $shapes --tokens 1,4,8,16,32,64 --routing uniform --runs 20 2>&1 | tee "$out/bench_gemm_tuned.txt"
build-gpu/fp4moe bench moe --layer shard --tokens 64,512 --routing uniform --tuned --iters 10 --warmup 3 2>&1 | tee "$out/bench_moe_tuned.txt"
