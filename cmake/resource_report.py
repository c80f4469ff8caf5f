#!/usr/bin/env python3
"""Writes the build's kernel resource report: registers, static shared memory and spills of every
kernel (__global__ function) in the given .cu files, for every architecture, as ptxas reports them
(nvcc -cubin --resource-usage). `fp4moe plan` reads it to count registers in occupancy when no GPU
is there to ask (cudaFuncGetAttributes).

  resource_report.py --out FILE --nvcc NVCC --arch 90a --arch 120a [--demangler c++filt]
                     [--include DIR]... [--flag FLAG]... SOURCE.cu...
  resource_report.py --out FILE --parse-log LOG [--demangler c++filt]   (a saved ptxas log)

Output: {"generator": ..., "kernels": [{"name", "mangled", "arch", "registers", "static_smem_bytes",
"spill_store_bytes", "spill_load_bytes", "stack_bytes", "source", "ptxas_advisories"}]}.

ptxas's performance advisories ("Potential Performance Loss", e.g. C7513) are recorded per kernel.
One that says a kernel's wgmma.mma_async instructions are serialized fails the run (exit 2, after
the report is written) unless --allow-serialized-wgmma: ptxas then waits for every wgmma before
the next instruction, so the weight decode never overlaps the tensor cores, and nothing else in
the build says so (docs/KERNELS.md).
"""

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
PROPERTIES = re.compile(r"Function properties for (\S+)")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers")
SMEM = re.compile(r"(\d+) bytes smem")
ADVISORY = re.compile(r"\((C\d+)\) Potential Performance Loss: (.*) in the function '([^']+)'")
SERIALIZED_WGMMA = "wgmma.mma_async instructions are serialized"


def parse_log(text, source):
    """Kernels in ptxas --resource-usage output, in order of appearance."""
    kernels = []
    entry = None  # the kernel whose "Used ..." line comes next
    frames = {}  # function name -> (stack, spill stores, spill loads)
    pending = None  # the function whose "Function properties" header was last seen
    advisories = {}  # function name -> ["C7513: ...", ...] (ptxas prints them before the entries)
    for line in text.splitlines():
        m = ADVISORY.search(line)
        if m:
            advisories.setdefault(m.group(3), []).append(f"{m.group(1)}: {m.group(2)}")
            continue
        m = ENTRY.search(line)
        if m:
            entry = {"mangled": m.group(1), "arch": m.group(2), "registers": 0, "static_smem_bytes": 0,
                     "spill_store_bytes": 0, "spill_load_bytes": 0, "stack_bytes": 0, "source": source}
            kernels.append(entry)
            continue
        m = PROPERTIES.search(line)
        if m:
            pending = m.group(1)
            continue
        m = FRAME.search(line)
        if m and pending is not None:
            frames[(pending, entry["arch"] if entry else "")] = tuple(int(g) for g in m.groups())
            pending = None
            continue
        m = USED.search(line)
        if m and entry is not None:
            entry["registers"] = int(m.group(1))
            s = SMEM.search(line)
            entry["static_smem_bytes"] = int(s.group(1)) if s else 0
            entry = None
    for k in kernels:
        stack, stores, loads = frames.get((k["mangled"], k["arch"]), (0, 0, 0))
        k["stack_bytes"], k["spill_store_bytes"], k["spill_load_bytes"] = stack, stores, loads
        k["ptxas_advisories"] = advisories.get(k["mangled"], [])
    return kernels


def demangle(kernels, demangler):
    names = [k["mangled"] for k in kernels]
    out = names
    if demangler and names:
        r = subprocess.run([demangler], input="\n".join(names) + "\n", capture_output=True, text=True, check=False)
        lines = r.stdout.splitlines()
        if r.returncode == 0 and len(lines) == len(names):
            out = lines
    for k, name in zip(kernels, out):
        k["name"] = name


def compile_one(args, tmp, source, arch):
    out = os.path.join(tmp, f"{os.path.basename(source)}.{arch}.cubin")
    cmd = [args.nvcc, "-cubin", "--resource-usage", "-std=c++" + args.std,
           "-gencode", f"arch=compute_{arch},code=sm_{arch}", "-o", out]
    cmd += [f"-I{d}" for d in args.include] + args.flag + [source]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return cmd, r


def compile_and_parse(args):
    """Compiles every (source, arch) pair, a few at a time, and parses them in a fixed order."""
    jobs = [(source, arch) for source in args.sources for arch in args.arch]
    kernels = []
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda job: compile_one(args, tmp, *job), jobs))
        for (source, _), (cmd, r) in zip(jobs, results):
            if r.returncode != 0:
                sys.stderr.write(f"resource_report.py: {' '.join(cmd)} failed ({r.returncode}):\n"
                                 f"{r.stdout}{r.stderr}")
                sys.exit(1)
            kernels += parse_log(r.stdout + r.stderr, os.path.relpath(source, args.root) if args.root else source)
    return kernels


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--nvcc")
    p.add_argument("--arch", action="append", default=[], help="e.g. 90a, 120a (repeat)")
    p.add_argument("--std", default="20")
    p.add_argument("--include", action="append", default=[])
    p.add_argument("--flag", action="append", default=[], help="extra nvcc flag (repeat)")
    p.add_argument("--demangler", default=shutil.which("cu++filt") or shutil.which("c++filt") or "")
    p.add_argument("--root", help="sources are recorded relative to this directory")
    p.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1), help="nvcc processes at once")
    p.add_argument("--parse-log", help="parse this saved ptxas log instead of compiling")
    p.add_argument("--allow-serialized-wgmma", action="store_true",
                   help="report kernels whose wgmmas ptxas serialized as a warning, not an error")
    p.add_argument("sources", nargs="*")
    args = p.parse_args()
    if args.parse_log:
        with open(args.parse_log, encoding="utf-8") as f:
            kernels = parse_log(f.read(), args.parse_log)
    else:
        if not args.nvcc or not args.arch:
            p.error("--nvcc and at least one --arch are needed to compile (or give --parse-log)")
        kernels = compile_and_parse(args)
    demangle(kernels, args.demangler)
    report = {"generator": "cmake/resource_report.py", "kernels": kernels}
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, args.out)
    serialized = [(k, a) for k in kernels for a in k["ptxas_advisories"] if SERIALIZED_WGMMA in a]
    if serialized:
        what = "warning" if args.allow_serialized_wgmma else "error"
        for k, a in serialized:
            sys.stderr.write(f"resource_report.py: {what}: {k.get('name', k['mangled'])} ({k['arch']}, "
                             f"{k['source']}): ptxas {a}\n")
        sys.stderr.write(f"resource_report.py: {what}: ptxas serialized the wgmmas of {len(serialized)} "
                         "kernel(s) (above): each wgmma is waited for before the next instruction, so the "
                         "decode cannot overlap the tensor cores (docs/KERNELS.md, \"ptxas and the wgmma "
                         "pipeline\"; -DFP4MOE_ALLOW_SERIALIZED_WGMMA=ON builds anyway).\n")
        if not args.allow_serialized_wgmma:
            sys.exit(2)


if __name__ == "__main__":
    main()
