#!/usr/bin/env bash
# Runs every libFuzzer target for a bounded time: tests/fuzz/run.sh BUILD_DIR SECONDS.
# The seed corpus (valid and malformed safetensors files) and the dictionary are generated here,
# so no binary is committed. Fails, printing the input as hex, if the fuzzer finds anything.
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR SECONDS}
seconds=${2:?usage: run.sh BUILD_DIR SECONDS}
fuzzer="$build/tests/fuzz/fuzz_safetensors"
[ -x "$fuzzer" ] || { echo "run.sh: $fuzzer not built (cmake --build $build --target fuzz_targets)"; exit 1; }

work="$build/fuzz-work"
rm -rf "$work/seeds" "$work/artifacts"
mkdir -p "$work/seeds" "$work/corpus" "$work/artifacts"

python3 - "$work/seeds" "$work/safetensors.dict" <<'PY'
import json, struct, sys, os
seeds, dict_path = sys.argv[1], sys.argv[2]

def st(header, data=b"", pad=True):
    text = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data

files = {
    "empty": st({}),
    "one_u8": st({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}, bytes(range(4))),
    "nvfp4": st({
        "__metadata__": {"format": "pt"},
        "w.weight_scale_2": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
        "w.weight": {"dtype": "U8", "shape": [2, 16], "data_offsets": [4, 36]},
        "w.weight_scale": {"dtype": "F8_E4M3", "shape": [2, 2], "data_offsets": [36, 40]},
    }, bytes(40)),
    "mixed": st({
        "b": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
        "f4": {"dtype": "F4", "shape": [4], "data_offsets": [12, 14]},
        "z": {"dtype": "F32", "shape": [0, 7], "data_offsets": [14, 14]},
        "i": {"dtype": "I64", "shape": [1], "data_offsets": [14, 22]},
    }, bytes(22)),
    "gap": st({"a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}, bytes(2)),
    "overlap": st({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                   "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, bytes(3)),
    "bad_dtype": st({"a": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}, bytes(1)),
    "bad_utf8": st(b'{"\xff":{}}'),
    "short_len": struct.pack("<Q", 1000) + b"{}",
}
for name, data in files.items():
    with open(os.path.join(seeds, name), "wb") as f:
        f.write(data)
tokens = ['"dtype"', '"shape"', '"data_offsets"', '"__metadata__"', '"F8_E4M3"', '"F8_E8M0"', '"BF16"',
          '"F4"', '"U8"', '"F32"', '"I64"', '"BOOL"', '[0,0]', '18446744073709551615', '9223372036854775807',
          '"\\u0000"', '"\\ud800"']
with open(dict_path, "w") as f:
    for i, t in enumerate(tokens):
        f.write("t%d=%s\n" % (i, json.dumps(t)))
PY

# libFuzzer stops starting new inputs after -max_total_time; a few seconds are kept for start-up
# and for the last input, so the whole run stays inside the time given.
budget=$(( seconds > 10 ? seconds - 5 : (seconds > 1 ? seconds - 1 : 1) ))
echo "fuzz: fuzz_safetensors for ${budget}s (seeds: $(ls "$work/seeds" | wc -l))"
status=0
timeout --signal=KILL "$seconds" "$fuzzer" "$work/corpus" "$work/seeds" -dict="$work/safetensors.dict" \
  -max_total_time="$budget" -max_len=4096 -timeout=5 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$work/artifacts/" >"$work/fuzz.log" 2>&1 || status=$?
tail -n 15 "$work/fuzz.log"
if [ "$status" -ne 0 ] || [ -n "$(ls -A "$work/artifacts")" ]; then
  echo "fuzz: FAILED (exit $status); the inputs that failed:"
  for f in "$work"/artifacts/*; do
    [ -f "$f" ] && { echo "$f:"; od -A d -t x1 "$f" | head -n 20; }
  done
  exit 1
fi
echo "fuzz: no findings"
