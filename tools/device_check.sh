#!/usr/bin/env bash
# One run on a GPU machine that re-checks everything: build for the local GPU, run the GPU and
# CPU tests, compute-sanitizer (memcheck, racecheck, synccheck) on small cases, and the
# benchmark. Logs and JSON go to $OUT (default ./device-out).
#
# The machine needs nvcc, cmake and ninja; the Debian packages the build needs (CLI11,
# nlohmann-json, fmt, GoogleTest) are taken from .device-debs/ when present (see
# ../shared/tools/device-debs) and unpacked outside the tree, or else must be installed.
#
# Environment: FP4MOE_ARCH (default: the local GPU's, e.g. 90a), FP4MOE_BENCH_ARGS (extra
# arguments of `fp4moe bench`), FP4MOE_GPU_FILTER (GoogleTest filter of the GPU tests),
# FP4MOE_STEPS (any of: build cpu gpu sanitize tune bench profile; default all but tune and
# profile), FP4MOE_TUNE_ARGS (arguments of `fp4moe tune`; the cache goes to $OUT/../tune.json and
# the bench after it uses it),
# FP4MOE_PROFILE_ARGS / _KERNELS / _SECTIONS / _METRICS / _COUNT / _LINES (the ncu step: bench
# arguments, kernel-name regex, extra sections, metrics, launches to profile, lines shown),
# FP4MOE_STEP_TIMEOUT (seconds each step may run, default 300; a timeout fails the step),
# FP4MOE_COMMIT (the commit the build reports; the copy's own .git may be stale). At most 8 files
# are written.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
steps=${FP4MOE_STEPS:-"build cpu gpu sanitize bench"}
build=${FP4MOE_BUILD_DIR:-/tmp/fp4moe-build}
status=0
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
has() { [[ " $steps " == *" $1 "* ]]; }
# A hung kernel must not eat the machine's time: every step after the build has a limit.
step_limit=${FP4MOE_STEP_TIMEOUT:-300}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv | tee "$OUT/summary.txt"

prefix=()
if [ -d .device-debs ]; then
  mkdir -p /tmp/devroot
  for f in .device-debs/*.deb; do dpkg -x "$f" /tmp/devroot; done
  prefix=(-DCMAKE_PREFIX_PATH=/tmp/devroot/usr)
fi
if [ -z "${FP4MOE_ARCH:-}" ]; then
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
  case "$cc" in 90|100|103|120|121) FP4MOE_ARCH="${cc}a" ;; *) FP4MOE_ARCH="$cc" ;; esac
fi

if has build; then
  # Only what the steps run: device time is short.
  targets=()
  has cpu && targets+=(fp4moe_tests)
  { has gpu || has sanitize; } && targets+=(fp4moe_gpu_tests)
  { has bench || has tune || has profile; } && targets+=(fp4moe_cli)
  [ ${#targets[@]} -gt 0 ] || targets=(all)
  log "build for sm_${FP4MOE_ARCH}: ${targets[*]}"
  start=$(date +%s)
  if cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=${FP4MOE_ARCH}-real" \
       "${prefix[@]}" > "$OUT/build.log" 2>&1 &&
     cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >> "$OUT/build.log" 2>&1; then
    log "build ok in $(( $(date +%s) - start )) s"
  else
    log "BUILD FAILED (see build.log)"; tail -40 "$OUT/build.log"; exit 1
  fi
  grep -E "spill|warning" "$OUT/build.log" | grep -v "0 bytes spill" | head -20
fi

if has cpu; then
  log "CPU tests"
  if "$build/tests/fp4moe_tests" --gtest_brief=1 > "$OUT/tests.log" 2>&1; then log "CPU tests ok"; else
    log "CPU TESTS FAILED"; tail -30 "$OUT/tests.log"; status=1; fi
fi

if has gpu; then
  log "GPU tests"
  start=$(date +%s)
  if timeout "$step_limit" "$build/tests/fp4moe_gpu_tests" --gtest_filter="${FP4MOE_GPU_FILTER:-*}" \
       --gtest_output=json:"$OUT/gpu-tests.json" >> "$OUT/tests.log" 2>&1; then
    log "GPU tests ok in $(( $(date +%s) - start )) s"
  else
    log "GPU TESTS FAILED"; grep -E "Failure|FAILED|error|Expected|Which is|relative" "$OUT/tests.log" | head -40; status=1
  fi
fi

if has sanitize; then
  small='GpuMoeLayer.SmallestLegalShapesAndKTail:GpuMoeLayer.FusedRoutingOnATinyLayer:GpuMoeLayer.StreamKernelWithManyItemsPerWarpOnATinyLayer:GpuMoeLayer.SigmoidGroupRouterWithSharedExpert:GpuMoeLayer.GptOssStyleMxfp4ClampedSwigluWithBiases:GpuMoeLayer.EveryCompiledTileConfigIsCorrect:GpuMoeLayer.EveryWgmmaConfigIsCorrect'
  # racecheck checks every shared-memory access: under it EveryWgmmaConfigIsCorrect ran past 125 s
  # and was cut (H200, 2026-12-02, a 150 s limit for the list), so racecheck takes the wgmma
  # kernels from the tail test instead.
  race="${small%:GpuMoeLayer.EveryWgmmaConfigIsCorrect}:GpuMoeLayer.WgmmaTailBlocksOfEverySizeAreCorrect"
  for tool in memcheck racecheck synccheck; do
    log "compute-sanitizer $tool"
    filter=$small
    [ "$tool" = racecheck ] && filter=$race
    if timeout "$step_limit" compute-sanitizer --tool "$tool" --error-exitcode 99 "$build/tests/fp4moe_gpu_tests" \
         --gtest_filter="$filter" > /tmp/sanitizer-$tool.log 2>&1; then
      log "$tool clean: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/sanitizer-$tool.log | tail -1)"
    else
      log "$tool FOUND ERRORS"; grep -E "=====" /tmp/sanitizer-$tool.log | head -30; status=1
    fi
    cat /tmp/sanitizer-$tool.log >> "$OUT/sanitizer.log"
  done
fi

if has tune; then
  log "tune"
  export FP4MOE_TUNE_CACHE=/tmp/fp4moe-tune.json
  # shellcheck disable=SC2086
  timeout "$step_limit" "$build/fp4moe" tune ${FP4MOE_TUNE_ARGS:---shape glm5 --tokens 1,4096 --quick} > "$OUT/tune.txt" 2>&1 || {
    log "TUNE FAILED"; status=1; }
  tail -15 "$OUT/tune.txt"
fi

if has bench; then
  log "bench"
  # shellcheck disable=SC2086
  timeout "$step_limit" "$build/fp4moe" bench --json "$OUT/bench.json" ${FP4MOE_BENCH_ARGS:-} > "$OUT/bench.txt" 2> /tmp/bench.err || {
    log "BENCH FAILED"; tail -20 /tmp/bench.err; status=1; }
  cat "$OUT/bench.txt"
fi

if has profile; then
  log "profile (ncu, one forward per token count)"
  metrics=${FP4MOE_PROFILE_METRICS:-gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active}
  what=(--metrics "$metrics")
  for sec in ${FP4MOE_PROFILE_SECTIONS:-}; do what+=(--section "$sec"); done
  [ -n "${FP4MOE_PROFILE_COUNT:-}" ] && what+=(-c "$FP4MOE_PROFILE_COUNT")
  ncu --clock-control none -k regex:"${FP4MOE_PROFILE_KERNELS:-fp4moe|route|group|finalize}" "${what[@]}" \
    "$build/fp4moe" bench --no-baseline --iterations 1 --warmup 0 --sets 1 ${FP4MOE_PROFILE_ARGS:---tokens 1,64} \
    >> "$OUT/profile.txt" 2>&1 || { log "PROFILE FAILED"; tail -20 "$OUT/profile.txt"; }
  grep -vE "^==PROF==|^bench:|^    -+|^ +Section:" "$OUT/profile.txt" | grep -vE "^\s*$" | head -${FP4MOE_PROFILE_LINES:-150}
fi
cat "$OUT/summary.txt"
exit $status
