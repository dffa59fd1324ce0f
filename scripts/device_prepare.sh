#!/usr/bin/env bash
# Prepares what the GPU machine needs but cannot fetch (it has no package access), in git-ignored
# folders that scripts/gpu_check.sh reads and the device run carries:
#   .carry/sysroot   Debian dev packages unpacked (headers, static/shared libs, CMake configs)
#   .carry/shared    a copy of ../shared (golden data, specs)
#   third_party/cutlass  the pinned CUTLASS headers (scripts/setup.sh)
# Run here (with package access) before a device run:  scripts/device_prepare.sh
# Then: device run with carry [".carry", "third_party"] and command `bash scripts/gpu_check.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
shared="${FP4MOE_SHARED:-$(cd .. && pwd)/shared}"
mkdir -p .carry
rm -rf .carry/shared && cp -r "$shared" .carry/shared && chmod -R u+w .carry/shared
pkgs=(nlohmann-json3-dev libcli11-dev libfmt-dev libfmt9 libgtest-dev libgmock-dev libbenchmark-dev
      libbenchmark1debian libcpp-httplib-dev libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0
      libpcre2-posix3 libutf8proc-dev libutf8proc2 libcpp-httplib0.11 libssl-dev libssl3 zlib1g-dev
      libbrotli-dev libbrotli1)
if [ ! -f .carry/sysroot/.done ]; then
  rm -rf .carry/sysroot .carry/debs && mkdir -p .carry/sysroot .carry/debs
  (cd .carry/debs && apt-get download "${pkgs[@]}" >/dev/null)
  for f in .carry/debs/*.deb; do dpkg -x "$f" .carry/sysroot; done
  rm -rf .carry/debs
  # Stay under the device call's 64 MiB: drop docs and the static libraries we link dynamically.
  rm -rf .carry/sysroot/usr/share/doc .carry/sysroot/usr/share/man
  rm -f .carry/sysroot/usr/lib/x86_64-linux-gnu/{libcrypto,libssl,libbrotli*,libz,libpcre2*,libutf8proc}.a
  touch .carry/sysroot/.done
fi
du -sh .carry third_party | sed 's/^/device_prepare: /'
