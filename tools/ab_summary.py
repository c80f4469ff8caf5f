#!/usr/bin/env python3
"""Side-by-side medians of `fp4moe bench --json` files: tools/ab_summary.py BASE.json... -- NEW.json...

One row per token count: each run's median (us), base runs then new runs, and base / new as the
ratio of the medians of the runs' medians (> 1: new is faster). Used by tools/device_ab.sh.
"""
import json
import statistics
import sys


def load(paths):
    runs = []
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        runs.append((d.get("commit", "?"), {r["tokens"]: r["fp4moe"]["median_us"] for r in d["rows"]}))
    return runs


def main(argv):
    if "--" not in argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    i = argv.index("--")
    base, new = load(argv[:i]), load(argv[i + 1:])
    if not base or not new:
        print("ab_summary: need at least one file on each side", file=sys.stderr)
        return 2
    tokens = sorted(set.intersection(*(set(r) for _, r in base + new)))
    print(f"base {base[0][0]} ({len(base)} runs) against new {new[0][0]} ({len(new)} runs); us, median of each run")
    print(f"{'tokens':>7}  {'base':>{9 * len(base)}}  {'new':>{9 * len(new)}}  {'base/new':>8}")
    for t in tokens:
        b = [r[t] for _, r in base]
        n = [r[t] for _, r in new]
        ratio = statistics.median(b) / statistics.median(n)
        print(f"{t:>7}  {''.join(f'{v:9.1f}' for v in b)}  {''.join(f'{v:9.1f}' for v in n)}  {ratio:7.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
