#!/usr/bin/env bash
# Quick start, command 1: install what is missing, build, and run `fp4moe bench` on the default
# GLM-5 layer shape (on a machine without a GPU: the CPU backend on a smaller shape).
# Extra arguments go to `fp4moe bench` (see `build/fp4moe bench --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
source tools/env.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP4MOE_TESTS=OFF >/dev/null
cmake --build build --target fp4moe_cli
exec build/fp4moe bench "$@"
