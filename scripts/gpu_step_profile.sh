#!/usr/bin/env bash
# Where a GPU decode step's time goes, kernel by kernel (one device call): Nsight Compute times every
# kernel of FP4MOE_STEPS eager decode steps of one bench-one-batch run: `--profile-decode` brackets the
# measured decode steps with cudaProfilerStart / Stop and ncu runs with `--profile-from-start off`, so the
# prefill (thousands of kernels at batch 64 x 1024 tokens, minutes under ncu) is not profiled; prints the
# kernels by time per step with their launches per step. Needs build-gpu (scripts/gpu_model_check.sh
# builds it) or builds fp4moe itself.
#   FP4MOE_PRESET (glm5-shard), FP4MOE_BATCH (64), FP4MOE_INPUT_LEN (1024), FP4MOE_WEIGHTS (nvfp4), FP4MOE_STEPS (2)
# Device call: carry [".carry", "third_party"], command `bash scripts/gpu_step_profile.sh`.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
if [ ! -x build-gpu/fp4moe ]; then
  gpu_configure build-gpu || exit 1
  cmake --build build-gpu -j "$(nproc)" --target fp4moe > "$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head; exit 1; }
fi
preset="${FP4MOE_PRESET:-glm5-shard}" batch="${FP4MOE_BATCH:-64}" len="${FP4MOE_INPUT_LEN:-1024}" steps="${FP4MOE_STEPS:-2}"
ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv --print-units base \
  build-gpu/fp4moe bench-one-batch --device cuda --model "$preset" --load-format dummy \
  --dummy-weights "${FP4MOE_WEIGHTS:-nvfp4}" --disable-cuda-graph --warmup 0 --batch-size "$batch" --input-len "$len" \
  --output-len "$steps" --profile-decode > "$out/ncu_steps.csv" 2> "$out/ncu_steps.err" || { tail -5 "$out/ncu_steps.err"; exit 1; }
python3 - "$out/ncu_steps.csv" "$steps" <<'EOF'
import csv, sys, collections
tot, cnt = collections.Counter(), collections.Counter()
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = r["Kernel Name"].split("(")[0][:90]
    tot[name] += float(r["Metric Value"].replace(",", ""))
    cnt[name] += 1
steps = int(sys.argv[2])
rows = sorted(((tot[k] / steps / 1e3, cnt[k] / steps, k) for k in tot), reverse=True)
total = sum(r[0] for r in rows)
print(f"decode step (mean of {steps}): {total:.1f} us of kernel time in {sum(r[1] for r in rows):.0f} launches")
print(f"{'us/step':>9} {'share':>6} {'launches':>8}  kernel")
for us, n, k in rows[:30]:
    print(f"{us:9.1f} {100 * us / total:5.1f}% {n:8.1f}  {k}")
EOF
