#!/usr/bin/env python3
"""Summarises the SASS source page of an Nsight Compute report.

Input: `ncu -i REPORT --page source --csv --print-source sass > FILE` (one row per SASS
instruction). Prints the columns found, the warp-stall samples per opcode, and the instructions
with the most samples, each with its share of all samples and its neighbours' opcodes — where a
kernel's warps wait, and on what.

usage: tools/ncu_stalls.py FILE [TOP]
"""
import csv
import sys
from collections import defaultdict


def number(s):
    try:
        return float(str(s).replace(",", ""))
    except ValueError:
        return 0.0


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 24
    with open(path, newline="") as f:
        lines = [l for l in f if l.strip() and not l.startswith("==")]
    rows = list(csv.reader(lines))
    if not rows:
        print("no rows")
        return 1
    while rows and rows[0] and rows[0][0] != "Address":  # a "Kernel Name" row comes first
        rows = rows[1:]
    if not rows:
        print("no header row")
        return 1
    head = rows[0]

    def col(*keys):
        for i, h in enumerate(head):
            if all(k.lower() in h.lower() for k in keys):
                return i
        return None

    src = col("source")
    samp = col("stall", "sampling", "all")
    if samp is None:
        samp = col("sampling")
    notissued = col("stall", "not")
    execd = col("instructions executed")
    if src is None or samp is None:
        print("no source / sampling column")
        return 1
    body = [r for r in rows[1:] if len(r) > max(src, samp)]
    total = sum(number(r[samp]) for r in body) or 1.0
    by_op = defaultdict(float)
    for r in body:
        op = r[src].strip().split(" ")[0] if r[src].strip() else "?"
        if op.startswith("@"):
            op = r[src].strip().split(" ")[1]
        by_op[op.split(".")[0]] += number(r[samp])
    print(f"samples {total:.0f}")
    print("per opcode:", ", ".join(f"{k} {100 * v / total:.1f}%"
                                   for k, v in sorted(by_op.items(), key=lambda x: -x[1])[:16]))
    reasons = [i for i, h in enumerate(head) if h.startswith("stall_") and "Not Issued" not in h]
    sums = {head[i]: sum(number(r[i]) for r in body if len(r) > i) for i in reasons}
    print("per reason:", ", ".join(f"{k[6:]} {100 * v / total:.1f}%"
                                   for k, v in sorted(sums.items(), key=lambda x: -x[1])[:10]))
    order = sorted(range(len(body)), key=lambda i: -number(body[i][samp]))[:top]
    for i in order:
        r = body[i]
        extra = ""
        if notissued is not None:
            extra += f" notissued {number(r[notissued]):.0f}"
        if execd is not None:
            extra += f" exec {number(r[execd]):.0f}"
        if reasons:
            main = sorted(reasons, key=lambda j: -number(r[j]) if len(r) > j else 0)[:2]
            extra += " (" + ", ".join(f"{head[j][6:]} {number(r[j]):.0f}" for j in main) + ")"
        prev = body[i - 1][src].strip()[:40] if i > 0 else ""
        print(f"{100 * number(r[samp]) / total:5.1f}% [{i:5d}] {r[src].strip()[:70]}{extra}"
              f"   <- {prev}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
