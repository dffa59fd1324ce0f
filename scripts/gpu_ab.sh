#!/usr/bin/env bash
# A/B of a change in one device call: builds the targets in this tree (A) and in a copy of it with a
# patch applied (B; with several patches B1, B2, ... one copy each), then runs the same command against
# each build, A then the Bs (then A again with FP4MOE_AB_REPEAT_A=1, so drift of clocks or temperature
# over the call shows up as A disagreeing with itself). Logs:
# $OUT/logs-gpu_ab.tgz (scripts/device_env.sh).
#   FP4MOE_AB_PATCH    the patch (`git diff` output, applied with patch -p1 to the copy; default
#                      .carry/ab.patch, so it travels with the carry); FP4MOE_AB_PATCHES: several,
#                      space-separated (an experiment branch: `git diff main...BRANCH > .carry/x.patch`)
#   FP4MOE_AB_TARGETS  cmake targets to build in both (default "bench_w4a16")
#   FP4MOE_AB_CMD      the command, run with $B set to the build folder (default
#                      '$B/bench/bench_w4a16 --runs 20 --tokens 1,4,8,16,32')
#   FP4MOE_AB_CHECK    a command run in each B, after the timings (e.g. its tests); empty: none
# Prepare here: scripts/device_prepare.sh, `git diff > .carry/ab.patch && git checkout -- <files>`;
# device call: carry [".carry", "third_party"], command `bash scripts/gpu_ab.sh`.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
patches=(${FP4MOE_AB_PATCHES:-${FP4MOE_AB_PATCH:-.carry/ab.patch}})
targets=(${FP4MOE_AB_TARGETS:-bench_w4a16})
status=0
for p in "${patches[@]}"; do [ -s "$p" ] || { echo "gpu_ab: no patch at $p"; exit 2; }; done

step "A: build (${targets[*]})"
gpu_configure build-gpu || exit 1
cmake --build build-gpu -j "$(nproc)" --target "${targets[@]}" > "$out/build_a.log" 2>&1 \
  || { echo "A: build failed"; grep -E "^FAILED|error" "$out/build_a.log" | head -20; exit 1; }
builds=("A:$PWD/build-gpu")
i=0
for p in "${patches[@]}"; do
  i=$((i + 1)); name="B$i"; [ ${#patches[@]} = 1 ] && name=B
  copy="/tmp/fp4moe-$name"
  step "$name: copy + patch $p + build"
  rm -rf "$copy" && mkdir -p "$copy"
  tar cf - --exclude=./build --exclude=./build-gpu --exclude=./device-logs . | tar xf - -C "$copy"
  pa=$(realpath "$p")
  (cd "$copy" && patch -p1 < "$pa") > "$out/patch_$name.log" 2>&1 || { cat "$out/patch_$name.log"; exit 2; }
  grep -c "^patching file" "$out/patch_$name.log" | sed "s/^/$name: files patched: /"
  (cd "$copy" && gpu_configure build-gpu) || exit 1
  cmake --build "$copy/build-gpu" -j "$(nproc)" --target "${targets[@]}" > "$out/build_$name.log" 2>&1 \
    || { echo "$name: build failed"; grep -E "^FAILED|error" "$out/build_$name.log" | head -20; status=1; continue; }
  builds+=("$name:$copy/build-gpu")
done
[ "${FP4MOE_AB_REPEAT_A:-0}" = 1 ] && builds+=("A2:$PWD/build-gpu")

ab_run_sides "${builds[@]}" || status=1
step "done (status $status)"
exit $status
