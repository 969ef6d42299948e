#!/usr/bin/env python3
"""Compiles the sm_90a wgmma kernel files with `ptxas -v` and fails when ptxas reports that it
serialised or fenced their wgmmas (its C751x infos: "Potential Performance Loss: wgmma.mma_async
instructions are serialized ...", "warpgroup.arrive is injected ..."). Those are infos, not
warnings, so a change that costs the Hopper kernels their asynchronous GEMMs otherwise builds
green; the sm90 prefill's intra-warpgroup overlap needs every wgmma issued, committed and waited
on one straight path (prefill_sm90_kernel.cuh). Spills are printed, not failed.
Each file is compiled with its own command from the build's compile_commands.json (so the flags
follow CMake's), with the target architectures replaced by sm_90a and the output discarded.
Usage: check_sm90_ptxas.py <compile_commands.json> <source path suffix>... Exit 1 on a finding,
a file missing from the database, or a failed compile."""
import json
import re
import shlex
import subprocess
import sys

# Flags dropped from the recorded command: its architectures, output and dependency file.
DROP_WITH_VALUE = {"-o", "-MT", "-MF", "-arch", "--gpu-architecture", "-code", "-gencode"}
DROP_PREFIXES = ("--generate-code", "-gencode=", "-arch=", "--gpu-architecture=", "-code=")
DROP_ALONE = {"-MD", "-MMD"}


def nvcc_command(entry: dict, arch: str = "sm_90a") -> list[str]:
    """The entry's compile command for `arch` alone, without its output or dependency file
    (the caller adds what to write). Also used by tools/sass_diff.py."""
    args = entry.get("arguments") or shlex.split(entry["command"])
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in DROP_WITH_VALUE:
            skip = True
        elif a in DROP_ALONE or a.startswith(DROP_PREFIXES):
            continue
        else:
            out.append(a)
    return out + [f"-arch={arch}"]


def ptxas_command(entry: dict) -> list[str]:
    return nvcc_command(entry) + ["-Xptxas", "-v", "-o", "/dev/null"]


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    with open(sys.argv[1]) as f:
        db = json.load(f)
    bad = 0
    for rel in sys.argv[2:]:
        entries = [e for e in db if e["file"].endswith("/" + rel)]
        if not entries:
            print(f"FAIL {rel}: not in {sys.argv[1]}")
            bad += 1
            continue
        cmd = ptxas_command(entries[0])
        run = subprocess.run(cmd, capture_output=True, text=True, cwd=entries[0]["directory"])
        out = run.stdout + run.stderr
        if run.returncode != 0:
            print(" ".join(cmd))
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
        bad += bool(found) or kernels == 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
