#!/usr/bin/env python3
"""Side-by-side medians of `fp4moe bench --json` files:
    tools/ab_summary.py [--stage NAME | --sustained | --energy] BASE.json... -- NEW.json...

One row per token count: each run's median (us), base runs then new runs, and base / new as the
ratio of the medians of the runs' medians (> 1: new is faster). Used by tools/device_ab.sh.

--stage NAME (routing, gather, gate/up, down, finalize or launch; files from `bench --stages`):
the stage's in-place time instead of the whole forward's. Stage times are differences of two
medians and can be near zero or negative, so the last column is then new - base (us) of the
medians of runs, not a ratio.

--sustained / --energy (files from `bench --sustain S`): the back-to-back run's time per forward,
or its energy per forward (mJ, where NVML was read), instead of the burst median; the last column
is base / new as for the whole forward (> 1: new is faster, or uses less energy).

A last line gives the range of the runs' ceilings (copy GB/s, dense BF16 TFLOP/s) where the files
have them, which PERF.md quotes beside each comparison.
"""
import json
import statistics
import sys


SUSTAINED = {"--sustained": "us_per_forward", "--energy": "mj_per_forward"}
CEILINGS = []  # (device, ceilings) of every file read, for the closing line


def ceilings_line():
    """The range of both ceilings over the runs, as PERF.md quotes them beside a comparison; None if
    no file has them."""
    copy = [c["copy_gbps"] for _, c in CEILINGS if c.get("copy_gbps")]
    gemm = [c["bf16_gemm_tflops"] for _, c in CEILINGS if c.get("bf16_gemm_tflops")]
    if not copy and not gemm:
        return None
    span = lambda v, unit: f"{min(v):.0f}-{max(v):.0f} {unit}" if v else "not measured"
    devices = sorted({dev for dev, _ in CEILINGS if dev})
    return (f"ceilings in these runs: copy {span(copy, 'GB/s')}, dense BF16 GEMM {span(gemm, 'TFLOP/s')}"
            + (f" ({', '.join(devices)})" if devices else ""))


def load(paths, stage, sustained):
    runs = []
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        values = {}
        for r in d["rows"]:
            if sustained is not None:
                v = (r.get("sustained") or {}).get(SUSTAINED[sustained])
                if v is not None:
                    values[r["tokens"]] = v
            elif stage is None:
                values[r["tokens"]] = r["fp4moe"]["median_us"]
            elif stage in (r.get("stages_us") or {}):
                values[r["tokens"]] = r["stages_us"][stage]
        if stage is not None and not values:
            raise SystemExit(f"ab_summary: {p} has no stage '{stage}' (run `fp4moe bench --stages`)")
        if sustained is not None and not values:
            what = "sustained run" if sustained == "--sustained" else "energy per forward (NVML not read)"
            raise SystemExit(f"ab_summary: {p} has no {what} (run `fp4moe bench --sustain S`)")
        runs.append((d.get("commit", "?"), values))
        CEILINGS.append((d.get("device"), d.get("ceilings") or {}))
    return runs


def main(argv):
    stage = None
    sustained = None
    if argv[:1] == ["--stage"]:
        if len(argv) < 2:
            print(__doc__.strip(), file=sys.stderr)
            return 2
        stage, argv = argv[1], argv[2:]
    elif argv[:1] and argv[0] in SUSTAINED:
        sustained, argv = argv[0], argv[1:]
    if "--" not in argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    i = argv.index("--")
    base, new = load(argv[:i], stage, sustained), load(argv[i + 1:], stage, sustained)
    if not base or not new:
        print("ab_summary: need at least one file on each side", file=sys.stderr)
        return 2
    tokens = sorted(set.intersection(*(set(r) for _, r in base + new)))
    if sustained == "--sustained":
        what = "us per forward back to back, each run"
    elif sustained == "--energy":
        what = "mJ per forward back to back, each run"
    else:
        what = "us, median of each run" if stage is None else f"stage {stage} in place, us, each run"
    print(f"base {base[0][0]} ({len(base)} runs) against new {new[0][0]} ({len(new)} runs); {what}")
    last = "base/new" if stage is None else "new-base"
    print(f"{'tokens':>7}  {'base':>{9 * len(base)}}  {'new':>{9 * len(new)}}  {last:>8}")
    for t in tokens:
        b = [r[t] for _, r in base]
        n = [r[t] for _, r in new]
        if stage is None:
            cmp = f"{statistics.median(b) / statistics.median(n):7.3f}x"
        else:
            cmp = f"{statistics.median(n) - statistics.median(b):+8.1f}"
        print(f"{t:>7}  {''.join(f'{v:9.1f}' for v in b)}  {''.join(f'{v:9.1f}' for v in n)}  {cmp}")
    line = ceilings_line()
    if line:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
