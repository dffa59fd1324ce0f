#!/usr/bin/env bash
# Installs everything fp4moe needs to build and test on a Debian 12 machine (root or sudo):
# compilers and libraries from Debian, and the pinned CUTLASS/CuTe headers from PyPI into
# third_party/cutlass (git-ignored). Idempotent: a second run only checks.
#   usage: scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

CUTLASS_PIP_VERSION="4.2.0.0"   # nvidia-cutlass wheel; carries include/{cutlass,cute} under cutlass_library/source

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

debs=(build-essential cmake ninja-build pkg-config python3 python3-pip
      nlohmann-json3-dev libcli11-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev
      libcpp-httplib-dev libpcre2-dev libutf8proc-dev clang libclang-rt-dev)
missing=()
for p in "${debs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
python3 -c 'import safetensors, numpy' 2>/dev/null || python3 -m pip install -q safetensors numpy || echo "setup: pip could not install safetensors numpy; test_safetensors skips its Python check"

# CUTLASS headers: header-only, not in Debian. The PyPI wheel nvidia-cutlass carries them.
dest=third_party/cutlass
if [ ! -f "$dest/VERSION" ] || [ "$(cat "$dest/VERSION")" != "$CUTLASS_PIP_VERSION" ]; then
  echo "setup: fetching CUTLASS headers (nvidia-cutlass==$CUTLASS_PIP_VERSION from PyPI)"
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "nvidia-cutlass==$CUTLASS_PIP_VERSION"
  python3 - "$tmp" "$dest" <<'PY'
import sys, zipfile, glob, os, shutil
tmp, dest = sys.argv[1], sys.argv[2]
whl = glob.glob(os.path.join(tmp, "*.whl"))[0]
shutil.rmtree(dest, ignore_errors=True)
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if n.startswith(prefix) and not n.endswith("/"):
            out = os.path.join(dest, "include", n[len(prefix):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(n) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
PY
  echo "$CUTLASS_PIP_VERSION" > "$dest/VERSION"
  rm -rf "$tmp"
fi
echo "setup: ok (CUTLASS $(cat $dest/VERSION) in $dest)"
