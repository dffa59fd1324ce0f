#!/usr/bin/env bash
# Quick start: set up, build, and run fp4moe's main job on the embedded default: the server
# (`fp4moe serve`, http://127.0.0.1:30000, CPU backend, built-in synthetic GLM-5-style model).
#   usage: scripts/run.sh [fp4moe args]   (with args: runs `fp4moe <args>` instead)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "${FP4MOE_JOBS:-$(nproc)}" --target fp4moe
if [ $# -gt 0 ]; then
  exec ./build/fp4moe "$@"
fi
exec ./build/fp4moe serve --host 127.0.0.1 --port 30000
