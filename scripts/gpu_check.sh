#!/usr/bin/env bash
# Runs on the GPU machine (an H200) in one call: builds fp4moe from source with CUDA (sm_90a), runs the
# whole test suite (GPU tests included), the GPU tests under compute-sanitizer (memcheck, racecheck),
# and the benchmarks. Logs: $OUT/logs-gpu_check.tgz (scripts/device_env.sh) for BENCHMARKS.md.
# Prepare first, here:  scripts/device_prepare.sh   (dependencies + golden data into .carry/)
# Device call: carry [".carry", "third_party"], command `bash scripts/gpu_check.sh`.
#   FP4MOE_STAGES  which of "tests sanitizer bench" to run after the build (default all)
#   FP4MOE_TARGETS build only these targets (default all; e.g. the sanitizer's test binaries)
#   FP4MOE_SANITIZE which test binaries the sanitizer stage runs (default all of its list)
#   FP4MOE_BENCH   which of "w4a16 large gemm moe read mla" the bench stage runs (default all; "large": bench_w4a16
#                  at 512-4096 rows, the sizes that decide the NVFP4 dequantize + cuBLAS thresholds; "read":
#                  bench_hbm_read, the read-only ceiling of the decode GEMMs' bytes and access pattern; "mla":
#                  bench_mla_decode, the MLA decode attention's splits against its planner and the mma.sync CTA)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
jobs=$(nproc)
status=0
stages=" ${FP4MOE_STAGES:-tests sanitizer bench} "

step "GPU"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$out/gpu.txt"
nvcc --version | tail -2

step "configure + build"
gpu_configure build-gpu || exit 1
# -k 0: build everything that can be built, so one broken target does not hide the other results.
targets=()
for t in ${FP4MOE_TARGETS:-}; do targets+=(--target "$t"); done
if ! cmake --build build-gpu -j "$jobs" "${targets[@]}" -- -k 0 > "$out/build.log" 2>&1; then
  status=1
  echo "BUILD FAILURES:"; grep -E "^FAILED|error" "$out/build.log" | head -20
fi
grep -iE "spill|local memory" "$out/build.log" | head -5

if has tests; then
step "tests (all labels)"
ctest --test-dir build-gpu -j 8 --output-on-failure > "$out/ctest.log" 2>&1 || status=1
tail -15 "$out/ctest.log"
grep -E "SKIPPED|Skipped" "$out/ctest.log" | head -5
fi

if has sanitizer; then
step "compute-sanitizer on GPU tests"
# The sanitizers slow kernels 10-100x: run the small-shape cases (the GLM-shape ones ran above). The out-of-memory
# message test makes cudaMalloc fail on purpose, which memcheck reports as an API error: it is left out.
declare -A sanitize_filter=([test_cuda_nvfp4]="*:-CudaCheck.OutOfMemoryNamesTheBytesAndTheFreeMemory" [test_cuda_w4a16]="W4A16Gpu.*:-W4A16Gpu.WgmmaPrefillGlmShapes" [test_cuda_ops]="*"
  [test_cuda_paged_attention]="*Small:*Flags*" [test_cuda_mla_decode]="*Tiny*"
  [test_cuda_mla_prefill]="*TinySparse*" [test_cuda_sampling]="*EdgeRows:*NanLogits*"
  [test_cuda_dsa_indexer]="*Tiny*:*Chunked*"
  [test_gpu_model]="*PrefillDecodeAndBatching*/1:*ShortKvPool*/1"
  [test_gpu_moe_layer]="*GraphReplayEqualsEager*:*TwoRunsBitIdentical*")
for name in ${FP4MOE_SANITIZE:-${!sanitize_filter[@]}}; do
  [ -n "${sanitize_filter[$name]:-}" ] || { echo "no sanitizer filter for $name"; status=1; continue; }
  t=$(find build-gpu/tests -name "$name" -type f -perm -u+x | head -1)
  [ -n "$t" ] || { echo "missing test binary $name"; status=1; continue; }
  for tool in memcheck racecheck; do
    log="$out/sanitizer_run.log"
    if timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 9 "$t" --gtest_filter="${sanitize_filter[$name]}" \
        > "$log" 2>&1; then
      echo "$tool $name: clean ($(grep -c '^\[       OK' "$log") tests)"
    else
      echo "$tool $name: FAILED"; tail -30 "$log"; status=1
    fi
    { echo "=== $tool $name"; cat "$log"; } >> "$out/sanitizer.log"; rm -f "$log"
  done
done
fi

if has bench; then
step "GPU benchmarks"
fp4moe=build-gpu/fp4moe
benches=" ${FP4MOE_BENCH:-w4a16 large gemm moe read mla} "
if [[ "$benches" == *" w4a16 "* ]]; then
  echo "--- bench_w4a16 (every config per row)"
  build-gpu/bench/bench_w4a16 --runs 20 2>&1 | tee "$out/bench_w4a16.txt" || status=1
fi
if [[ "$benches" == *" large "* ]]; then
  echo "--- bench_w4a16 at prefill sizes: shard 1024-4096 rows per expert, dense Linears 512-8192 rows"
  build-gpu/bench/bench_w4a16 --runs 5 --tokens 1024,2048,4096 2>&1 | tee "$out/bench_w4a16_large.txt" || status=1
  build-gpu/bench/bench_w4a16 --runs 5 --tokens 512,2048,8192 --shape 1,6144,16384 --shape 1,16384,2048 \
    --shape 1,12288,6144 --shape 1,6144,12288 2>&1 | tee "$out/bench_w4a16_dense.txt" || status=1
fi
if [[ "$benches" == *" gemm "* ]]; then
  echo "--- fp4moe bench gemm (default configs, uniform + Zipf routing)"
  "$fp4moe" bench gemm --runs 20 2>&1 | tee "$out/bench_gemm.txt" || status=1
fi
if [[ "$benches" == *" moe "* ]]; then
  echo "--- fp4moe bench moe (GLM-5 shard and full layer, NVFP4 vs BF16 cuBLAS layer)"
  "$fp4moe" bench moe --iters 10 --warmup 3 2>&1 | tee "$out/bench_moe.txt" || status=1
fi
if [[ "$benches" == *" read "* ]]; then
  echo "--- bench_hbm_read (the decode GEMMs' bytes read with no arithmetic: plain, the stream kernel's pattern, bulk)"
  build-gpu/bench/bench_hbm_read --runs 20 2>&1 | tee "$out/bench_hbm_read.txt" || status=1
fi
if [[ "$benches" == *" mla "* ]]; then
  echo "--- bench_mla_decode (GLM-5 MLA decode attention: every split vs the planner's, the mma.sync CTA as peer)"
  build-gpu/bench/bench_mla_decode --seqs 1,4,16,32,48,64,128 --keys 1032,2048 --runs 20 2>&1 |
    tee "$out/bench_mla_decode.txt" || status=1
fi
fi

step "done (status $status)"
exit $status
