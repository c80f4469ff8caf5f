#!/usr/bin/env bash
# Installs what fp4moe needs to build and test, from Debian's packages, when it is missing.
# Safe to run again: it installs nothing that is already there. The CUDA toolkit (nvcc) is not
# installed here: with it on PATH the kernels are built, without it the CPU backend only.
set -euo pipefail

packages=(cmake ninja-build g++ git pkg-config libcli11-dev nlohmann-json3-dev libfmt-dev
          libgtest-dev libgmock-dev clang clang-format libclang-rt-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The cross-tool test reads and writes safetensors with Python's own package (NumPy, no torch).
if ! python3 -c "import safetensors, numpy" >/dev/null 2>&1; then
  echo "setup: installing Python safetensors and numpy"
  python3 -m pip install --quiet safetensors numpy ||
    python3 -m pip install --quiet --break-system-packages safetensors numpy
fi
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: nvcc found at /usr/local/cuda/bin (add it to PATH to skip this note)"
fi
