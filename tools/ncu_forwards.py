#!/usr/bin/env python3
"""Splits an `ncu --csv --metrics gpu__time_duration.sum` kernel log of a pagoda run into model
forwards (each ends with the sampler's last kernel) and compares the kernel times of decode
forwards (attention through decode_tc / decode_tct) with verify-shaped ones (attention through a
prefill kernel), per kernel name: where a verify forward's extra time goes.

    python3 tools/ncu_forwards.py ncu.csv [--sampler sample_kernel]
"""
import argparse
import collections
import csv
import re
import statistics
import sys


def short(name):
    name = re.sub(r"\(.*", "", name)
    name = re.sub(r"<.*", "", name)
    return name.split("::")[-1][:60]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--sampler", default="sample")
    a = ap.parse_args()
    rows = []
    with open(a.csv, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        rows.append((r["Kernel Name"], float(r["Metric Value"].replace(",", ""))))
    forwards, cur = [], []
    for i, (k, t) in enumerate(rows):
        cur.append((k, t))
        nxt = rows[i + 1][0] if i + 1 < len(rows) else ""
        if a.sampler in k and a.sampler not in nxt:
            forwards.append(cur)
            cur = []
    kinds = collections.defaultdict(list)
    for fw in forwards:
        names = " ".join(k for k, _ in fw)
        kind = "verify" if "prefill" in names else ("decode" if "decode_t" in names else "other")
        kinds[kind].append(fw)
    print(f"{len(rows)} kernels, {len(forwards)} forwards:",
          {k: len(v) for k, v in kinds.items()})
    def per_name(fws):
        tot = collections.defaultdict(list)
        for fw in fws:
            acc = collections.defaultdict(float)
            cnt = collections.defaultdict(int)
            for k, t in fw:
                acc[short(k)] += t
                cnt[short(k)] += 1
            for k in acc:
                tot[k].append((acc[k], cnt[k]))
        return {k: (statistics.median(x for x, _ in v), statistics.median(c for _, c in v))
                for k, v in tot.items()}
    med = {k: per_name(v[2:]) for k, v in kinds.items() if len(v) > 2}  # skip warm-up forwards
    names = sorted(set().union(*[set(m) for m in med.values()]))
    cols = sorted(med)
    print("kernel | " + " | ".join(f"{c} µs (launches)" for c in cols))
    for n in names:
        cells = []
        for c in cols:
            v = med[c].get(n)
            cells.append(f"{v[0] / 1e3:9.1f} ({v[1]:.0f})" if v else "-")
        print(f"{n} | " + " | ".join(cells))
    for c in cols:
        tot = [sum(t for _, t in fw) / 1e3 for fw in kinds[c][2:]]
        print(f"{c}: median forward kernel time {statistics.median(tot):.1f} µs over {len(tot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
