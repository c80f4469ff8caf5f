#!/usr/bin/env python3
"""tools/ab_summary.py on made-up `fp4moe bench --json` files: the whole forward's ratio of medians,
a stage's difference of medians (--stage), and a clear error for a stage the files lack."""
import json
import pathlib
import subprocess
import sys
import tempfile

TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "ab_summary.py"


def bench_json(path, commit, forward_us, finalize_us, sustained=None, ceilings=None):
    rows = [{"tokens": t, "fp4moe": {"median_us": f}, "stages_us": {"finalize": s}}
            for t, f, s in zip((1, 4), forward_us, finalize_us)]
    for row, (us, mj) in zip(rows, sustained or []):
        row["sustained"] = {"us_per_forward": us, "mj_per_forward": mj}
    d = {"commit": commit, "rows": rows}
    if ceilings:
        d["device"] = "NVIDIA H200"
        d["ceilings"] = {"copy_gbps": ceilings[0], "bf16_gemm_tflops": ceilings[1]}
    path.write_text(json.dumps(d))
    return str(path)


def run(*args):
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True)


def main():
    with tempfile.TemporaryDirectory() as d:
        d = pathlib.Path(d)
        base = [bench_json(d / f"b{i}.json", "aaa", (80.0 + i, 200.0), (3.0, 6.0 + i)) for i in range(3)]
        new = [bench_json(d / f"n{i}.json", "bbb", (78.0 + i, 190.0), (2.0, 4.0 + i)) for i in range(3)]
        whole = run(*base, "--", *new)
        assert whole.returncode == 0, whole.stderr
        lines = whole.stdout.splitlines()
        assert lines[0].startswith("base aaa (3 runs) against new bbb (3 runs)"), lines[0]
        # medians 81 / 79 and 200 / 190
        assert lines[2].split()[0] == "1" and lines[2].endswith(f"{81.0 / 79.0:7.3f}x"), lines[2]
        assert lines[3].split()[0] == "4" and lines[3].endswith(f"{200.0 / 190.0:7.3f}x"), lines[3]
        stage = run("--stage", "finalize", *base, "--", *new)
        assert stage.returncode == 0, stage.stderr
        rows = stage.stdout.splitlines()[2:]
        assert [r.split()[-1] for r in rows] == ["-1.0", "-2.0"], rows  # 2 - 3; 5 - 7
        missing = run("--stage", "routing", *base, "--", *new)
        assert missing.returncode != 0 and "has no stage 'routing'" in missing.stderr, missing.stderr
        nosust = run("--sustained", *base, "--", *new)
        assert nosust.returncode != 0 and "has no sustained run" in nosust.stderr, nosust.stderr
        sb = [bench_json(d / f"sb{i}.json", "aaa", (80.0, 200.0), (3.0, 6.0), ((90.0 + i, 40.0), (210.0, 130.0)))
              for i in range(3)]
        sn = [bench_json(d / f"sn{i}.json", "bbb", (78.0, 190.0), (2.0, 4.0), ((88.0, 39.0 + i), (200.0, None)))
              for i in range(3)]
        sus = run("--sustained", *sb, "--", *sn)
        assert sus.returncode == 0, sus.stderr
        assert "us per forward back to back" in sus.stdout.splitlines()[0], sus.stdout
        assert sus.stdout.splitlines()[2].endswith(f"{91.0 / 88.0:7.3f}x"), sus.stdout
        energy = run("--energy", *sb, "--", *sn)
        assert energy.returncode == 0, energy.stderr
        lines = energy.stdout.splitlines()
        # T=4's new energy was not read (null): only T=1 is compared, medians 40 / 40
        assert len(lines) == 3 and lines[2].endswith(f"{40.0 / 40.0:7.3f}x"), energy.stdout
        # With the ceilings in the files: a last line with their range over every run.
        cb = [bench_json(d / f"cb{i}.json", "aaa", (80.0, 200.0), (3.0, 6.0), ceilings=(4230.4 + i, 781.0))
              for i in range(2)]
        cn = [bench_json(d / f"cn{i}.json", "bbb", (78.0, 190.0), (2.0, 4.0), ceilings=(4190.0, 797.2 - i))
              for i in range(2)]
        with_ceilings = run(*cb, "--", *cn)
        assert with_ceilings.returncode == 0, with_ceilings.stderr
        assert with_ceilings.stdout.splitlines()[-1] == (
            "ceilings in these runs: copy 4190-4231 GB/s, dense BF16 GEMM 781-797 TFLOP/s (NVIDIA H200)"
        ), with_ceilings.stdout
        assert "ceilings" not in whole.stdout, whole.stdout
        usage = run(*base)
        assert usage.returncode == 2 and "ab_summary.py" in usage.stderr, usage.stderr
    print("ab_summary: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
