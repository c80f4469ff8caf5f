#!/usr/bin/env bash
# Quick start, command 2: install what is missing, build, and run the whole test suite:
#   1. the Release build (CUDA kernels compiled when nvcc is present) and every GoogleTest test
#      through CTest (GPU tests skip with a reason where there is no GPU);
#   2. the tests again under AddressSanitizer + UndefinedBehaviorSanitizer (host code);
#   3. the safetensors reader's libFuzzer target for a bounded time;
#   4. the sources against the checked-in .clang-format.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
source tools/env.sh

echo "== 1/4 build and test (Release)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build
ctest --test-dir build --output-on-failure -j "$FP4MOE_JOBS"

echo "== 2/4 build and test under ASan + UBSan (host code)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DFP4MOE_SANITIZE=ON -DFP4MOE_CUDA=OFF >/dev/null
cmake --build build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$FP4MOE_JOBS"

echo "== 3/4 fuzz"
if [ -f tests/fuzz/CMakeLists.txt ]; then
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DFP4MOE_FUZZ=ON -DFP4MOE_TESTS=OFF -DFP4MOE_CUDA=OFF >/dev/null
  cmake --build build-fuzz --target fuzz_targets
  tests/fuzz/run.sh build-fuzz "${FP4MOE_FUZZ_SECONDS:-60}"
else
  echo "no fuzz targets"
fi
echo "== 4/4 format"
git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' | xargs clang-format --dry-run --Werror
echo "== all tests passed"
