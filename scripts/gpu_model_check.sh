#!/usr/bin/env bash
# The GPU model (--device cuda) on the GPU machine in one call: builds the CLI and the GPU model /
# ops / MoE tests, runs them, a compute-sanitizer memcheck of a short model run, bench-one-batch on
# a dummy preset (NVFP4 W4A16 vs the BF16 cuBLAS peer, same run), and serve + bench-serving +
# analyze against `fp4moe serve --device cuda` on that preset with NVFP4 and with BF16 weights.
# Logs: $OUT/logs-gpu_model_check.tgz (scripts/device_env.sh).
#   FP4MOE_PRESET   the dummy preset (default glm45-air-shard; glm5-shard, glm5-small)
#   FP4MOE_STAGES   which of "tests sanitizer initcheck one-batch serve golden-serve" to run (default all
#                   but initcheck)
#   FP4MOE_SERVE_VARIANTS  weights served in the serve stage (default "nvfp4 bf16"; "nvfp4-eager" is
#                   NVFP4 with --disable-cuda-graph, "nvfp4-timed" NVFP4 with --time-moe-gemms: analyze's
#                   measured per-GEMM rates, at the timing events' cost in step time)
#   FP4MOE_CONCURRENCY  bench-serving concurrencies (default "1 16 64")
#   FP4MOE_EXTRA_TESTS  more test binaries to build and run
# Prepare here: scripts/device_prepare.sh; device call: carry [".carry", "third_party"],
# command `bash scripts/gpu_model_check.sh`.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
status=0
preset="${FP4MOE_PRESET:-glm45-air-shard}"
stages=" ${FP4MOE_STAGES:-tests sanitizer one-batch serve golden-serve} "
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

step "build"
gpu_configure build-gpu || exit 1
tests=(test_gpu_model test_gpu_kv_cache test_cuda_ops test_cuda_ops_host test_gpu_moe_layer test_cuda_paged_attention
       ${FP4MOE_EXTRA_TESTS:-})
cmake --build build-gpu -j "$(nproc)" --target fp4moe "${tests[@]}" -- -k 0 > "$out/build.log" 2>&1 \
  || { status=1; grep -E "^FAILED|error" "$out/build.log" | head -20; }

has tests || tests=()
step "tests"
for name in "${tests[@]}"; do
  t=$(find build-gpu/tests -name "$name" -type f -perm -u+x | head -1)
  [ -n "$t" ] || { echo "$name: not built"; status=1; continue; }
  if "$t" > "$out/$name.log" 2>&1; then r=ok; else r=FAILED; status=1; fi
  echo "$name: $r ($(grep -c '^\[       OK' "$out/$name.log") ok, $(grep -c '^\[  SKIPPED' "$out/$name.log") skipped)"
  grep -E "cosine|argmax|selections|Failure|FAILED  \]|error" "$out/$name.log" | head -30
done

if has sanitizer; then
  step "compute-sanitizer memcheck (GPU models, prefill/decode/batching on the NVFP4 golden models)"
  t=$(find build-gpu/tests -name test_gpu_model -type f | head -1)
  if [ -n "$t" ] && timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$t" \
      --gtest_filter='*PrefillDecodeAndBatching*/1:*ShortKvPool*/1' > "$out/sanitizer.log" 2>&1; then
    echo "memcheck test_gpu_model: clean ($(grep -c '^\[       OK' "$out/sanitizer.log") tests)"
  else
    echo "memcheck test_gpu_model: FAILED"; tail -30 "$out/sanitizer.log"; status=1
  fi
fi

if has initcheck; then
  step "compute-sanitizer initcheck (GPU models on the NVFP4 golden models)"
  t=$(find build-gpu/tests -name test_gpu_model -type f | head -1)
  if [ -n "$t" ] && timeout 300 compute-sanitizer --tool initcheck --check-bulk-copy yes --error-exitcode 9 "$t" \
      --gtest_filter='*PrefillDecodeAndBatching*/1:*PrefillDecodeAndBatching*/3' > "$out/initcheck.log" 2>&1; then
    echo "initcheck test_gpu_model: clean ($(grep -c '^\[       OK' "$out/initcheck.log") tests)"
  else
    echo "initcheck test_gpu_model: FAILED"; grep -E "Uninitialized|at 0x|by thread|in |Host Frame" "$out/initcheck.log" | head -40
    status=1
  fi
fi

fp4moe=build-gpu/fp4moe
if has one-batch; then
  step "bench-one-batch --device cuda: golden glm4_moe_tiny_nvfp4"
  "$fp4moe" bench-one-batch --device cuda --model "$FP4MOE_SHARED/golden/models/glm4_moe_tiny_nvfp4" \
    --batch-size 1,16 --input-len 64 --output-len 16 2>&1 | tail -6 || status=1
  step "bench-one-batch: the $preset preset, dummy NVFP4 (W4A16 kernels with and without CUDA graphs vs the BF16 cuBLAS peer)"
  for peer in "" "--disable-cuda-graph" "--bf16-peer"; do
    echo "--- ${peer:-nvfp4 w4a16, cuda graphs}"
    "$fp4moe" bench-one-batch --device cuda --model "$preset" --load-format dummy --dummy-weights nvfp4 $peer \
      --batch-size 1,16,64,256 --input-len 128 --output-len 16 2>&1 | tail -8 || status=1
  done
fi

if has serve; then
  for variant in ${FP4MOE_SERVE_VARIANTS:-nvfp4 bf16}; do
    w=${variant%-eager}; w=${w%-timed}
    case "$variant" in
      *-eager) extra="--disable-cuda-graph" ;;
      *-timed) extra="--time-moe-gemms" ;;
      *) extra="" ;;
    esac
    step "serve --device cuda + bench-serving + analyze ($preset, dummy $w weights $extra)"
    "$fp4moe" serve --device cuda --model "$preset" --load-format dummy --dummy-weights $w $extra \
      --tokenizer-path "$FP4MOE_SHARED/golden/tokenizer" --max-running-requests 256 --port 30112 \
      > "$out/serve_$variant.log" 2>&1 &
    pid=$!
    for i in $(seq 1 400); do curl -sf localhost:30112/health > /dev/null && break; sleep 0.5; done
    for c in ${FP4MOE_CONCURRENCY:-1 16 64}; do
      echo "--- $variant, concurrency $c"
      "$fp4moe" bench-serving --url http://localhost:30112 --num-prompts $((c * 3)) --max-concurrency $c \
        --input-len 128 --output-len 64 --output-file "$out/bench_serving_${variant}_c$c.json" 2>&1 \
        | grep -E "Successful|Output token throughput|Median TTFT|Median TPOT|P99 TPOT" | head -8
    done
    "$fp4moe" analyze --url http://localhost:30112 --model "$preset" --weights $w 2>&1 | tee "$out/analyze_$variant.txt" | tail -40
    kill -TERM $pid; wait $pid; tail -2 "$out/serve_$variant.log"
  done
fi

has golden-serve || { step "done (status $status)"; exit $status; }
step "serve --device cuda + bench-serving (golden glm4_moe_tiny_nvfp4)"
"$fp4moe" serve --device cuda --model "$FP4MOE_SHARED/golden/models/glm4_moe_tiny_nvfp4" \
  --tokenizer-path "$FP4MOE_SHARED/golden/tokenizer" --port 30111 > "$out/serve.log" 2>&1 &
pid=$!
for i in $(seq 1 120); do curl -sf localhost:30111/health > /dev/null && break; sleep 0.5; done
curl -s localhost:30111/generate -d '{"input_ids":[1,2,3,4,5],"sampling_params":{"max_new_tokens":8,"temperature":0}}'; echo
for c in 1 16 64; do
  "$fp4moe" bench-serving --url http://localhost:30111 --num-prompts $((c * 4)) --max-concurrency $c \
    --input-len 64 --output-len 32 2>&1 | grep -E "Successful|throughput|TTFT|TPOT" | head -8
done
kill -TERM $pid; wait $pid; tail -3 "$out/serve.log"

step "done (status $status)"
exit $status
