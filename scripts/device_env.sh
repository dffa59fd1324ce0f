# Sourced by the device scripts (gpu_*.sh): the environment of a run on the GPU machine, which has
# no package access and gets its dependencies from scripts/device_prepare.sh's git-ignored .carry/.
#   out            this script's log folder, device-logs/<script> (git-ignored). The device tool brings
#                  back at most 8 files from $OUT, so the logs are packed into one file,
#                  $OUT/logs-<script>.tgz, when the script exits (also when `timeout` stops it: TERM and
#                  INT exit through the EXIT trap; a SIGKILL loses them). Without $OUT they stay put.
#   sysroot        the unpacked Debian dev packages; their libraries on LD_LIBRARY_PATH
#   FP4MOE_SHARED  the copy of ../shared (golden data, specs)
#   gpu_configure DIR   CMake configure of a Release CUDA build in DIR against the sysroot (log in $out)
#   step MSG            prints "=== MSG (HH:MM:SS)", the stage markers of the logs
#   has STAGE           true when STAGE is in the script's $stages (" a b c ", from FP4MOE_STAGES)
#   ab_run_sides SIDE:DIR ...   the A/B scripts' runs (gpu_ab.sh, prebuilt_ab.sh): FP4MOE_AB_CMD against
#                       each side in order with $B = DIR (logs run_SIDE.txt), then FP4MOE_AB_CHECK in each
#                       B side (check_SIDE.log); returns 1 when a command failed
cd "$(dirname "${BASH_SOURCE[0]}")/.."
script_name="$(basename "$0" .sh)"
out="$PWD/device-logs/$script_name"
rm -rf "$out"
mkdir -p "$out"
pack_logs() { [ -z "${OUT:-}" ] || { mkdir -p "$OUT" && tar czf "$OUT/logs-$script_name.tgz" -C "$out" .; }; }
trap pack_logs EXIT
trap 'exit 143' TERM INT
sysroot="$PWD/.carry/sysroot/usr"
export FP4MOE_SHARED="$PWD/.carry/shared"
export LD_LIBRARY_PATH="$sysroot/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
gpu_configure() {
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP4MOE_CUDA=ON -DCMAKE_PREFIX_PATH="$sysroot" \
    -DCMAKE_INCLUDE_PATH="$sysroot/include" -DCMAKE_LIBRARY_PATH="$sysroot/lib/x86_64-linux-gnu" \
    > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; return 1; }
}
step() { echo "=== $* ($(date +%T))"; }
has() { [[ "$stages" == *" $1 "* ]]; }
ab_run_sides() {
  local cmd="${FP4MOE_AB_CMD:-\$B/bench/bench_w4a16 --runs 20 --tokens 1,4,8,16,32}" status=0 entry side B
  for entry in "$@"; do
    side="${entry%%:*}"; B="${entry#*:}"
    step "run $side"
    (export B; eval "$cmd") 2>&1 | tee "$out/run_$side.txt" || status=1
  done
  if [ -n "${FP4MOE_AB_CHECK:-}" ]; then
    for entry in "$@"; do
      side="${entry%%:*}"; B="${entry#*:}"
      case "$side" in B*) ;; *) continue ;; esac
      step "check ($side)"
      (export B; eval "$FP4MOE_AB_CHECK") > "$out/check_$side.log" 2>&1 || status=1
      tail -6 "$out/check_$side.log"
    done
  fi
  return $status
}
