#!/usr/bin/env bash
# Quick start: set up, build, and run fp4moe's main job on the embedded default.
#   usage: scripts/run.sh [fp4moe args]   (default: the SMEM plan of a GLM-5 MoE layer on an H200
#   and an RTX PRO 6000, then `fp4moe inspect` of a tiny NVFP4 checkpoint the tool generates)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "${FP4MOE_JOBS:-$(nproc)}" --target fp4moe
if [ $# -gt 0 ]; then
  exec ./build/fp4moe "$@"
fi
./build/fp4moe plan --gpu h200 --problem moe:E=256,topk=8,H=6144,I=2048 --tokens 1,16,64,512,4096
./build/fp4moe plan --gpu rtx-pro-6000 --kernel cutlass-sm120-moe --problem moe:E=256,topk=8,H=6144,I=2048
./build/fp4moe inspect --demo
