#!/usr/bin/env bash
# A/B of two builds on one GPU machine, the protocol docs/PERF.md's comparisons use: the two
# `fp4moe` binaries' benchmarks alternate (base, new, base, new, ...) so that both see the same
# machine, clocks and neighbours, and a table puts every run's medians side by side with the
# ratio of the medians of runs. Optionally `fp4moe tune --max-configs 1` per build: the
# dispatcher's GEMM configurations timed alone.
#
# Usage: tools/device_ab.sh BASE_BIN NEW_BIN (the same binary twice to compare environments)
# Environment: FP4MOE_AB_BASE_ENV / FP4MOE_AB_NEW_ENV (VAR=value ... set for that side's runs only,
# e.g. FP4MOE_AB_NEW_ENV=FP4MOE_TUNE_CACHE=/tmp/tune.json FP4MOE_AB_BASE_ENV=FP4MOE_TUNE_CACHE=/none
# to measure what a tune cache gains), FP4MOE_AB_BASE_ARGS / FP4MOE_AB_NEW_ARGS (bench arguments
# added on that side only, e.g. FP4MOE_AB_BASE_ARGS=--no-l2-evict-first with the same binary twice:
# what a MoeLayerOptions switch gains), FP4MOE_AB_RUNS (alternations, default 2), FP4MOE_AB_BENCH_ARGS (default
# "--no-baseline --iterations 30"; with --sustain S the summary adds the back-to-back times and the
# energy per forward), FP4MOE_AB_TUNE_TOKENS (e.g. 256,1024,4096: also tune both),
# FP4MOE_AB_SHAPES (e.g. "gpt-oss-120b:1,2,4 glm5:1,2": several layers, each with its token
# counts, alternated shape by shape, one summary per shape in ab.txt; what a dispatcher change
# wants, as it moves several shapes' picks; the JSON files then stay in /tmp/fp4moe-ab),
# OUT (default ./device-out). Writes ab.txt (the summary), ab-{base,new}-N.json and, when tuning,
# tune-{base,new}.txt; keep $OUT to 8 files (the device tool brings back at most 8).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: $0 BASE_BIN NEW_BIN" >&2; exit 2; }
base=$1
new=$2
for b in "$base" "$new"; do [ -x "$b" ] || { echo "$0: $b is not an executable" >&2; exit 2; }; done
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
runs=${FP4MOE_AB_RUNS:-2}
read -r -a args <<< "${FP4MOE_AB_BENCH_ARGS:---no-baseline --iterations 30}"
read -r -a base_env <<< "${FP4MOE_AB_BASE_ENV:-}"
read -r -a new_env <<< "${FP4MOE_AB_NEW_ENV:-}"
read -r -a base_args <<< "${FP4MOE_AB_BASE_ARGS:-}"
read -r -a new_args <<< "${FP4MOE_AB_NEW_ARGS:-}"
status=0
# One alternation series: bench arguments "$@" on both sides, JSON to $1-{base,new}-N.json, the
# summary appended to ab.txt.
series() {
  local prefix=$1
  shift
  local r side bin side_env side_args
  for ((r = 1; r <= runs; ++r)); do
    for side in base new; do
      bin=$base
      side_env=("${base_env[@]}")
      side_args=("${base_args[@]}")
      if [ "$side" = new ]; then
        bin=$new
        side_env=("${new_env[@]}")
        side_args=("${new_args[@]}")
      fi
      echo "== $side run $r: ${side_env[*]} $bin bench $* ${side_args[*]}"
      env "${side_env[@]}" "$bin" bench "$@" "${side_args[@]}" --json "$prefix-$side-$r.json" > /dev/null \
        2> "/tmp/ab-$side-$r.err" || {
        echo "BENCH FAILED ($side run $r)"; tail -5 "/tmp/ab-$side-$r.err"; status=1; }
    done
  done
  python3 tools/ab_summary.py "$prefix"-base-*.json -- "$prefix"-new-*.json | tee -a "$OUT/ab.txt" || status=1
  # With --sustain in the bench arguments: the back-to-back times and the energy per forward too
  # (per shape as well: until 2026-12-03 only the single-shape series printed them).
  if [[ " $* " == *" --sustain "* ]]; then
    for m in --sustained --energy; do
      python3 tools/ab_summary.py "$m" "$prefix"-base-*.json -- "$prefix"-new-*.json | tee -a "$OUT/ab.txt" || status=1
    done
  fi
}
: > "$OUT/ab.txt"
if [ -n "${FP4MOE_AB_SHAPES:-}" ]; then
  mkdir -p /tmp/fp4moe-ab
  for entry in $FP4MOE_AB_SHAPES; do
    shape=${entry%%:*}
    tokens=${entry#*:}
    [ "$tokens" = "$entry" ] && tokens=""
    echo "== $shape" | tee -a "$OUT/ab.txt"
    rm -f /tmp/fp4moe-ab/"$shape"-*.json
    if [ -n "$tokens" ]; then
      series "/tmp/fp4moe-ab/$shape" "${args[@]}" --shape "$shape" --tokens "$tokens"
    else
      series "/tmp/fp4moe-ab/$shape" "${args[@]}" --shape "$shape"
    fi
  done
  exit $status
fi
series "$OUT/ab" "${args[@]}"
if [ -n "${FP4MOE_AB_TUNE_TOKENS:-}" ]; then
  for side in base new; do
    bin=$base
    [ "$side" = new ] && bin=$new
    FP4MOE_TUNE_CACHE=/tmp/ab-tune-$side.json "$bin" tune --tokens "$FP4MOE_AB_TUNE_TOKENS" --max-configs 1 \
      > "$OUT/tune-$side.txt" 2>&1 || { echo "TUNE FAILED ($side)"; status=1; }
    echo "== tune, $side:"
    grep -E "^bucket|fastest:" "$OUT/tune-$side.txt"
  done
fi
exit $status
