#!/usr/bin/env bash
# A/B of a change in one device call: builds the targets in this tree (A) and in a copy of it with a
# patch applied (B), then runs the same command against each build, A then B (then A again with
# FP4MOE_AB_REPEAT_A=1, so drift of clocks or temperature over the call shows up as A disagreeing with
# itself). Logs:
# $OUT/logs-gpu_ab.tgz (scripts/device_env.sh).
#   FP4MOE_AB_PATCH    the patch (`git diff` output, applied with patch -p1 to the copy; default
#                      .carry/ab.patch, so it travels with the carry)
#   FP4MOE_AB_TARGETS  cmake targets to build in both (default "bench_w4a16")
#   FP4MOE_AB_CMD      the command, run with $B set to the build folder (default
#                      '$B/bench/bench_w4a16 --runs 20 --tokens 1,4,8,16,32')
#   FP4MOE_AB_CHECK    a command run in B only, after the timings (e.g. B's tests); empty: none
# Prepare here: scripts/device_prepare.sh, `git diff > .carry/ab.patch && git checkout -- <files>`;
# device call: carry [".carry", "third_party"], command `bash scripts/gpu_ab.sh`.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
patch_file="${FP4MOE_AB_PATCH:-.carry/ab.patch}"
targets=(${FP4MOE_AB_TARGETS:-bench_w4a16})
cmd="${FP4MOE_AB_CMD:-\$B/bench/bench_w4a16 --runs 20 --tokens 1,4,8,16,32}"
[ -s "$patch_file" ] || { echo "gpu_ab: no patch at $patch_file"; exit 2; }
status=0

step "copy + patch (B)"
copy=/tmp/fp4moe-b
rm -rf "$copy" && mkdir -p "$copy"
tar cf - --exclude=./build --exclude=./build-gpu --exclude=./device-logs . | tar xf - -C "$copy"
(cd "$copy" && patch -p1 < "$OLDPWD/$patch_file") > "$out/patch.log" 2>&1 || { cat "$out/patch.log"; exit 2; }
cat "$out/patch.log"

step "build A and B (${targets[*]})"
gpu_configure build-gpu || exit 1
cmake --build build-gpu -j "$(nproc)" --target "${targets[@]}" > "$out/build_a.log" 2>&1 \
  || { echo "A: build failed"; grep -E "^FAILED|error" "$out/build_a.log" | head -20; exit 1; }
(cd "$copy" && gpu_configure build-gpu) || exit 1
cmake --build "$copy/build-gpu" -j "$(nproc)" --target "${targets[@]}" > "$out/build_b.log" 2>&1 \
  || { echo "B: build failed"; grep -E "^FAILED|error" "$out/build_b.log" | head -20; exit 1; }

sides="A B"; [ "${FP4MOE_AB_REPEAT_A:-0}" = 1 ] && sides="A B A2"
for side in $sides; do
  B="$PWD/build-gpu"; [ "$side" = B ] && B="$copy/build-gpu"
  step "run $side"
  (export B; eval "$cmd") 2>&1 | tee "$out/run_$side.txt" || status=1
done

if [ -n "${FP4MOE_AB_CHECK:-}" ]; then
  step "check (B)"
  (B="$copy/build-gpu"; export B; eval "$FP4MOE_AB_CHECK") > "$out/check_b.log" 2>&1 || status=1
  tail -15 "$out/check_b.log"
fi
step "done (status $status)"
exit $status
