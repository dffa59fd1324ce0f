#!/usr/bin/env bash
# scripts/gpu_ab.sh without the device-side builds (they take 60-120 s of a call's device time): the A
# and B sides are built here and carried as one compressed archive, the device only runs them.
#   scripts/prebuilt_ab.sh prepare   (here) builds FP4MOE_AB_TARGETS at HEAD (A) and at HEAD + each patch of
#                                    FP4MOE_AB_PATCHES (B1, B2, ...; one patch: B) in a worktree under /tmp,
#                                    incrementally, strips the binaries and packs them, with their paths
#                                    under build/, into $FP4MOE_AB_ARCHIVE (default .carry/ab.tar.xz; git-ignored)
#   scripts/prebuilt_ab.sh run       (device; carry [".carry"]) unpacks $FP4MOE_AB_ARCHIVE and runs FP4MOE_AB_CMD against each
#                                    side with $B set to the side's build folder (A, the Bs, A again with
#                                    FP4MOE_AB_REPEAT_A=1), then FP4MOE_AB_CHECK in each B, as gpu_ab.sh does.
# The binaries link the device's CUDA libraries and .carry/sysroot's (scripts/device_prepare.sh); they
# need a glibc >= 2.34 there. Logs: $OUT/logs-prebuilt_ab.tgz.
set -uo pipefail
mode="${1:?usage: scripts/prebuilt_ab.sh prepare|run}"
archive="${FP4MOE_AB_ARCHIVE:-.carry/ab.tar.xz}"

case "$mode" in
  prepare)
    set -e
    cd "$(dirname "$0")/.."
    root="$PWD"
    patches=(${FP4MOE_AB_PATCHES:?FP4MOE_AB_PATCHES: the patches of the B sides})
    targets=(${FP4MOE_AB_TARGETS:-bench_w4a16})
    for p in "${patches[@]}"; do git apply --check "$p" || { echo "prebuilt_ab: $p does not apply to HEAD"; exit 2; }; done
    bash scripts/setup.sh >/dev/null
    wt=/tmp/fp4moe-prebuilt-ab stage=/tmp/fp4moe-prebuilt-stage
    git worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"
    git worktree prune
    git worktree add --detach "$wt" HEAD >/dev/null
    ln -s "$root/third_party" "$wt/third_party"
    rm -rf "$stage" && mkdir -p "$stage"
    cmake -S "$wt" -B "$wt/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP4MOE_CUDA=ON >/dev/null
    # Copies the targets' executables of the current build into the side's folder, paths kept.
    collect() {
      local side="$1" t f
      cmake --build "$wt/build" -j "$(nproc)" --target "${targets[@]}" > "$stage/build_$side.log" 2>&1 ||
        { grep -E "^FAILED|error" "$stage/build_$side.log" | head -20; return 1; }
      for t in "${targets[@]}"; do
        f=$(cd "$wt/build" && find . -type f -name "$t" -perm -u+x | head -1)
        [ -n "$f" ] || { echo "prebuilt_ab: no executable $t"; return 1; }
        mkdir -p "$stage/$side/$(dirname "$f")"
        strip -o "$stage/$side/$f" "$wt/build/$f"
      done
      echo "prebuilt_ab: $side built ($(du -sh "$stage/$side" | cut -f1))"
    }
    collect A
    i=0
    for p in "${patches[@]}"; do
      i=$((i + 1)); side="B$i"; [ ${#patches[@]} = 1 ] && side=B
      (cd "$wt" && git apply "$root/$p")
      collect "$side"
      (cd "$wt" && git apply -R "$root/$p")
    done
    mkdir -p .carry
    tar cJf "$archive" -C "$stage" --exclude='build_*.log' .
    git worktree remove --force "$wt"
    echo "prebuilt_ab: $archive $(du -sh "$archive" | cut -f1) (sides: $(ls -d "$stage"/*/ | xargs -n1 basename | tr '\n' ' '))"
    ;;
  run)
    source "$(dirname "$0")/device_env.sh"
    [ -s "$archive" ] || { echo "prebuilt_ab: no $archive (scripts/prebuilt_ab.sh prepare, here)"; exit 2; }
    dir=/tmp/fp4moe-ab
    rm -rf "$dir" && mkdir -p "$dir" && tar xJf "$archive" -C "$dir" || exit 2
    sides=("A:$dir/A")
    for b in $(cd "$dir" && ls -d B* 2>/dev/null | sort -V); do sides+=("$b:$dir/$b"); done
    [ "${FP4MOE_AB_REPEAT_A:-0}" = 1 ] && sides+=("A2:$dir/A")
    status=0
    ab_run_sides "${sides[@]}" || status=1
    step "done (status $status)"
    exit $status
    ;;
  *) echo "usage: scripts/prebuilt_ab.sh prepare|run"; exit 2 ;;
esac
