#!/usr/bin/env bash
# Where a GPU decode step's time goes, kernel by kernel (one device call): Nsight Compute times every
# kernel of two eager bench-one-batch runs (--warmup 0) that differ only in --output-len (A and A + 2), so the
# per-kernel difference is exactly two decode steps; prints the kernels by time per step with their
# launch counts. Needs build-gpu (scripts/gpu_model_check.sh builds it) or builds fp4moe itself.
#   FP4MOE_PRESET (glm5-shard), FP4MOE_BATCH (64), FP4MOE_INPUT_LEN (1024), FP4MOE_WEIGHTS (nvfp4)
# Device call: carry [".carry", "third_party"], command `bash scripts/gpu_step_profile.sh`.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
if [ ! -x build-gpu/fp4moe ]; then
  gpu_configure build-gpu || exit 1
  cmake --build build-gpu -j "$(nproc)" --target fp4moe > "$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head; exit 1; }
fi
preset="${FP4MOE_PRESET:-glm5-shard}" batch="${FP4MOE_BATCH:-64}" len="${FP4MOE_INPUT_LEN:-1024}"
for n in 1 3; do
  ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    build-gpu/fp4moe bench-one-batch --device cuda --model "$preset" --load-format dummy \
    --dummy-weights "${FP4MOE_WEIGHTS:-nvfp4}" --disable-cuda-graph --warmup 0 --batch-size "$batch" --input-len "$len" \
    --output-len "$n" > "$out/ncu_out$n.csv" 2> "$out/ncu_out$n.err" || { tail -5 "$out/ncu_out$n.err"; exit 1; }
done
python3 - "$out/ncu_out1.csv" "$out/ncu_out3.csv" <<'EOF'
import csv, sys, collections
def load(path):
    tot, cnt = collections.Counter(), collections.Counter()
    with open(path) as f:
        rows = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(rows):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r["Kernel Name"].split("(")[0][:90]
        tot[name] += float(r["Metric Value"].replace(",", ""))
        cnt[name] += 1
    return tot, cnt
(t1, c1), (t3, c3) = load(sys.argv[1]), load(sys.argv[2])
rows = [(((t3[k] - t1[k]) / 2) / 1e3, (c3[k] - c1[k]) / 2, k) for k in set(t3) | set(t1)]
rows = [r for r in rows if r[1] > 0]
rows.sort(reverse=True)
total = sum(r[0] for r in rows)
print(f"decode step (two steps' difference / 2): {total:.1f} us of kernel time in {sum(r[1] for r in rows):.0f} launches")
print(f"{'us/step':>9} {'share':>6} {'launches':>8}  kernel")
for us, n, k in rows[:30]:
    print(f"{us:9.1f} {100 * us / total:5.1f}% {n:8.0f}  {k}")
EOF
