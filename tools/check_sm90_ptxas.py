#!/usr/bin/env python3
"""Compiles the sm_90a wgmma kernel files with `ptxas -v` and fails when ptxas reports that it
serialised or fenced their wgmmas (its C751x infos: "Potential Performance Loss: wgmma.mma_async
instructions are serialized ...", "warpgroup.arrive is injected ..."). Those are infos, not
warnings, so a change that costs the Hopper kernels their asynchronous GEMMs otherwise builds
green; the sm90 prefill's intra-warpgroup overlap needs every wgmma issued, committed and waited
on one straight path (prefill_sm90_kernel.cuh). Spills are printed, not failed.
Usage: check_sm90_ptxas.py <nvcc> <src-root> <file relative to src-root>... Exit 1 on a finding
or a failed compile."""
import re
import subprocess
import sys


def main() -> int:
    if len(sys.argv) < 4:
        print(__doc__)
        return 2
    nvcc, src = sys.argv[1], sys.argv[2]
    bad = 0
    for rel in sys.argv[3:]:
        cmd = [nvcc, f"-I{src}", "-std=c++20", "--expt-relaxed-constexpr", "-O3", "-DNDEBUG",
               "-arch=sm_90a", "--use_fast_math", "-Xptxas", "-v", "-x", "cu", "-c",
               f"{src}/{rel}", "-o", "/dev/null"]
        run = subprocess.run(cmd, capture_output=True, text=True)
        out = run.stdout + run.stderr
        if run.returncode != 0:
            print(out)
            print(f"FAIL {rel}: nvcc exited {run.returncode}")
            bad += 1
            continue
        found = [l for l in out.splitlines() if re.search(r"\(C751\d\)", l)]
        spills = [l.strip() for l in out.splitlines()
                  if re.search(r"[1-9]\d* bytes spill stores", l)]
        kernels = len(re.findall(r"Compiling entry function", out))
        for line in found:
            print(line)
        print(f"{'FAIL' if found else 'ok'} {rel}: {kernels} kernels, {len(found)} wgmma "
              f"serialisation / injection reports, {len(spills)} with spills")
        for line in spills:
            print("  spill:", line)
        bad += bool(found)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
