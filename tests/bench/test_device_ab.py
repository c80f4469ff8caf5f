#!/usr/bin/env python3
"""tools/device_ab.sh with a stand-in `fp4moe` that writes made-up bench JSON: one series and the
per-shape series (FP4MOE_AB_SHAPES) both print the whole forward's summary, and with --sustain in
the bench arguments the back-to-back and energy summaries too (the per-shape series once left
those out); FP4MOE_AB_BASE_ARGS / FP4MOE_AB_NEW_ARGS reach their side's bench only."""
import os
import pathlib
import stat
import subprocess
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "device_ab.sh"

FAKE = """#!/usr/bin/env python3
import json, sys
args = sys.argv[1:]
out = args[args.index("--json") + 1]
with open(out + ".args", "w") as f:
    f.write(" ".join(args))
rows = [{"tokens": t, "fp4moe": {"median_us": 100.0 * t},
         "sustained": {"us_per_forward": 110.0 * t, "mj_per_forward": 5.0 * t}} for t in (1, 4)]
json.dump({"commit": "fake", "device": "Fake GPU",
           "ceilings": {"copy_gbps": 4000.0, "bf16_gemm_tflops": 800.0}, "rows": rows}, open(out, "w"))
"""


def run(env_extra, out):
    env = dict(os.environ, OUT=str(out), FP4MOE_AB_RUNS="1", **env_extra)
    return subprocess.run(["bash", str(TOOL), FAKE_BIN, FAKE_BIN], capture_output=True, text=True, env=env)


def main():
    global FAKE_BIN
    with tempfile.TemporaryDirectory() as d:
        d = pathlib.Path(d)
        fake = d / "fp4moe"
        fake.write_text(FAKE)
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
        FAKE_BIN = str(fake)

        one = run({"FP4MOE_AB_BENCH_ARGS": "--no-baseline --sustain 1"}, d / "one")
        assert one.returncode == 0, one.stdout + one.stderr
        text = (d / "one" / "ab.txt").read_text()
        assert text.count("base fake (1 runs) against new fake (1 runs)") == 3, text
        assert "us per forward back to back" in text and "mJ per forward back to back" in text, text

        shapes = run({"FP4MOE_AB_BENCH_ARGS": "--no-baseline --sustain 1",
                      "FP4MOE_AB_SHAPES": "glm5:1,4 qwen3-235b:1"}, d / "shapes")
        assert shapes.returncode == 0, shapes.stdout + shapes.stderr
        text = (d / "shapes" / "ab.txt").read_text()
        assert "== glm5" in text and "== qwen3-235b" in text, text
        assert text.count("us per forward back to back") == 2, text
        assert text.count("mJ per forward back to back") == 2, text

        sides = run({"FP4MOE_AB_BASE_ARGS": "--no-l2-evict-first --seed 3", "FP4MOE_AB_NEW_ARGS": ""},
                    d / "sides")
        assert sides.returncode == 0, sides.stdout + sides.stderr
        base_args = (d / "sides" / "ab-base-1.json.args").read_text().split()
        new_args = (d / "sides" / "ab-new-1.json.args").read_text().split()
        assert "--no-l2-evict-first" in base_args and "--seed" in base_args, base_args
        assert "--no-l2-evict-first" not in new_args and "--seed" not in new_args, new_args

        plain = run({"FP4MOE_AB_SHAPES": "glm5:1"}, d / "plain")
        assert plain.returncode == 0, plain.stdout + plain.stderr
        text = (d / "plain" / "ab.txt").read_text()
        assert text.count("against") == 1 and "back to back" not in text, text
    print("ok")


if __name__ == "__main__":
    main()
