#!/usr/bin/env python3
"""Nsight Compute kernel logs of pagoda runs, split into model forwards (each ends with the
sampler's last kernel).

    python3 tools/ncu_forwards.py ncu.csv [--sampler sample_kernel]

As a tool: compares the kernel times of decode forwards (attention through decode_tc /
decode_tct) with verify-shaped ones (attention through a prefill kernel), per kernel name: where
a verify forward's extra time goes.

As a module (bench/device/record.py): read_kernels() reads `ncu --csv` output, split_forwards()
cuts it into forwards, step_profile() sums the last N forwards per kernel (the decode step
profile of bench/device/run.sh's profile group).

Input: ncu's CSV on stdout, mixed with the application's lines and ncu's "==PROF==" lines (only
lines starting with a quote are read), either the details page (`ncu --csv --metrics ...`: one
row per kernel and metric, columns "ID", "Kernel Name", "Grid Size", "Metric Name", "Metric
Unit", "Metric Value") or the raw page (`--page raw`: one row per kernel, one column per metric,
its units in the row under the header). Values are converted to base units (ns, bytes, %);
thousands separators are dropped."""
import argparse
import collections
import csv
import re
import statistics
import sys

# Base unit and factor of each unit ncu prints (--print-units base prints the first of each).
UNITS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
         "second": 1e9, "s": 1e9, "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9,
         "Tbyte": 1e12, "KB": 1e3, "MB": 1e6, "GB": 1e9, "%": 1.0, "": 1.0}
TIME = "gpu__time_duration.sum"
READ, WRITE = "dram__bytes_read.sum", "dram__bytes_write.sum"
DRAM_PCT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
METRICS = (TIME, READ, WRITE, DRAM_PCT)  # what read_kernels keeps; run.sh's --metrics


def short(name):
    name = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    name = re.sub(r"^void ", "", name)
    m = re.match(r"([\w:]+)(<[^()]*>)?", name)
    base = m.group(1).split("::")[-1] if m else name
    targs = m.group(2) if m and m.group(2) else ""
    targs = targs.replace("__nv_bfloat16", "bf16").replace(" ", "")
    return (base + targs)[:70]


def value(text, unit, where):
    if unit not in UNITS:
        raise ValueError(f"{where}: unit {unit!r} is not one ncu_forwards.py converts")
    try:
        return float(text.replace(",", "")) * UNITS[unit]
    except ValueError:
        raise ValueError(f"{where}: value {text!r} is not a number") from None


def read_kernels(lines):
    """Kernels in launch order: [{"name", "grid", "metrics": {metric: value in base units}}]."""
    rows = list(csv.reader(ln for ln in lines if ln.startswith('"')))
    if not rows:
        return []
    head, body = rows[0], rows[1:]
    col = {h: i for i, h in enumerate(head)}
    if "Kernel Name" not in col:
        raise ValueError(f"ncu CSV header has no 'Kernel Name' column: {head[:6]}")
    kernels = []
    if "Metric Name" in col:  # details page: one row per (kernel, metric), a kernel's rows adjacent
        by_id = {}
        for r in body:
            if len(r) != len(head) or r[col["ID"]] == "ID":
                continue
            k = by_id.get(r[col["ID"]])
            if k is None:
                grid = r[col["Grid Size"]] if "Grid Size" in col else ""
                k = by_id[r[col["ID"]]] = {"name": r[col["Kernel Name"]], "grid": grid,
                                           "metrics": {}}
                kernels.append(k)
            m = r[col["Metric Name"]]
            if m in METRICS:
                k["metrics"][m] = value(r[col["Metric Value"]], r[col["Metric Unit"]],
                                        f"kernel {r[col['ID']]} {m}")
        return kernels
    units = [""] * len(head)
    if body and body[0][col["Kernel Name"]] == "":  # raw page: the units row
        units, body = body[0], body[1:]
    metric_cols = [i for i, h in enumerate(head) if h in METRICS]
    for r in body:
        if len(r) != len(head):
            continue
        kernels.append({"name": r[col["Kernel Name"]],
                        "grid": r[col["Grid Size"]] if "Grid Size" in col else "",
                        "metrics": {head[i]: value(r[i], units[i], f"kernel {r[0]} {head[i]}")
                                    for i in metric_cols}})
    return kernels


def split_forwards(kernels, sampler):
    """Forwards (lists of kernels), each ending with the last of a run of kernels whose short name
    contains `sampler`; the kernels after the last such run are left out."""
    forwards, cur = [], []
    for i, k in enumerate(kernels):
        cur.append(k)
        nxt = short(kernels[i + 1]["name"]) if i + 1 < len(kernels) else ""
        if sampler in short(k["name"]) and sampler not in nxt:
            forwards.append(cur)
            cur = []
    return forwards


def step_profile(kernels, steps, sampler="sample_kernel"):
    """The last `steps` forwards summed per kernel group (short name and grid): per group the
    launches per step and, per step, the time (ns) and DRAM bytes (read + write), and the
    time-weighted mean of ncu's DRAM throughput (% of peak); per step the kernel count and time.
    "uniform": every step launched the same kernels (names and grids) in the same order. The
    first forward may be cut by the profiling window (--launch-skip), so at least steps + 1
    forwards are needed."""
    forwards = split_forwards(kernels, sampler)
    if len(forwards) < steps + 1:
        raise ValueError(f"{len(forwards)} forwards (sampler '{sampler}') in {len(kernels)} "
                         f"kernels: fewer than the {steps} steps asked + 1")
    chosen = forwards[-steps:]
    groups = {}
    for s, fw in enumerate(chosen):
        for k in fw:
            key = short(k["name"]) + (f" {k['grid'].replace(' ', '')}" if k["grid"] else "")
            g = groups.setdefault(key, {"name": key, "launches": [0] * steps, "ns": [0.0] * steps,
                                        "bytes": [0.0] * steps, "pct_ns": 0.0})
            m = k["metrics"]
            if any(x not in m for x in METRICS):
                missing = [x for x in METRICS if x not in m]
                raise ValueError(f"kernel {key}: no {missing} in the log")
            g["launches"][s] += 1
            g["ns"][s] += m[TIME]
            g["bytes"][s] += m[READ] + m[WRITE]
            g["pct_ns"] += m[DRAM_PCT] * m[TIME]
    out = []
    for g in sorted(groups.values(), key=lambda g: -sum(g["ns"])):
        total = sum(g["ns"])
        out.append({"name": g["name"], "launches": g["launches"],
                    "ns": g["ns"], "bytes": g["bytes"],
                    "dram_pct": g["pct_ns"] / total if total else 0.0})
    seqs = [[(short(k["name"]), k["grid"]) for k in fw] for fw in chosen]
    return {"steps": steps, "forwards_seen": len(forwards), "profiled_kernels": len(kernels),
            "step_kernels": [len(fw) for fw in chosen],
            "step_ns": [sum(k["metrics"][TIME] for k in fw) for fw in chosen],
            "uniform": all(s == seqs[0] for s in seqs), "groups": out}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--sampler", default="sample")
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        kernels = read_kernels(f)
    rows = [(k["name"], k["metrics"][TIME]) for k in kernels if TIME in k["metrics"]]
    forwards = [[(k["name"], k["metrics"][TIME]) for k in fw]
                for fw in split_forwards(kernels, a.sampler)]
    kinds = collections.defaultdict(list)
    for fw in forwards:
        names = " ".join(k for k, _ in fw)
        kind = "verify" if "prefill" in names else ("decode" if "decode_t" in names else "other")
        if kind == "verify":  # a chain's 2-token step 0 vs the target's 4-token verify
            kind += "-" + ("n2" if "small_m_gemm_kernel<bf16,2" in " ".join(short(k) for k, _ in fw) else "n>2")
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
