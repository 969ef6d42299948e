#!/usr/bin/env python3
"""The CPU model's bf16 GEMMs: pagoda's AMX GEMM and oneDNN 2.6's matmul (`bench_cpu_gemm`, one
process, random interleaving) against torch's `F.linear` (bf16, the same shapes and threads), in
--rounds alternating rounds (pagoda's process, then torch, again and again) so that load from
other processes falls on every side alike. Cells: the median (min–max) over the rounds of each
side's GFLOP/s (and the weights' GB/s for decode-sized M). torch is a test client only.
Writes cpu_gemm_vs_torch.md and .json into --out.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import time

from cpu_vs_torch import cpu_model, write_results  # this folder is on sys.path when run


def pagoda_round(exe, threads):
    """{(side, m, n, k): GFLOP/s} of one bench_cpu_gemm run."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([exe, "--benchmark_enable_random_interleaving=true",
                          "--benchmark_format=json"], check=True, capture_output=True,
                         text=True, env=env).stdout
    res = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("error_occurred"):
            continue
        side, m, n, k = re.match(r"BM_(\w+)/(\d+)/(\d+)/(\d+)", b["name"]).groups()
        res[(side.lower(), int(m), int(n), int(k))] = b["GFLOP/s"]  # the counter is in GFLOP/s
    return res


def torch_round(shapes, threads, iters=7):
    import torch
    torch.set_num_threads(threads)
    res = {}
    with torch.inference_mode():
        for m, n, k in shapes:
            x = torch.randn(m, k).to(torch.bfloat16)
            w = torch.randn(n, k).to(torch.bfloat16)
            for _ in range(3):
                torch.nn.functional.linear(x, w)
            ts = []
            for _ in range(iters):
                t0 = time.perf_counter()
                torch.nn.functional.linear(x, w)
                ts.append(time.perf_counter() - t0)
            res[("torch", m, n, k)] = 2 * m * n * k / statistics.median(ts) / 1e9
    return res, torch.__version__


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="the bench_cpu_gemm binary")
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--commit", default="?", help="the commit the binary was built from")
    args = ap.parse_args()
    t0 = time.time()
    samples = {}
    version = "?"
    for _ in range(args.rounds):
        p = pagoda_round(args.bench, args.threads)
        shapes = sorted({key[1:] for key in p})
        t, version = torch_round(shapes, args.threads)
        for key, v in {**p, **t}.items():
            samples.setdefault(key, []).append(v)
    shapes = sorted({key[1:] for key in samples})
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")

    def cell(side, shape):
        s = samples.get((side,) + shape)
        if not s:
            return "–", None
        med = statistics.median(s)
        gbs = f"; {med / shape[0]:.1f} GB/s" if shape[0] <= 16 else ""  # 2nk bytes per 2mnk flops
        return f"{med:,.0f} ({min(s):,.0f}–{max(s):,.0f}){gbs}", med

    lines = [f"# CPU bf16 GEMMs: pagoda amx vs oneDNN 2.6 vs torch F.linear (commit {args.commit})",
             "", f"- machine: {cpu_model()}, {os.cpu_count()} logical CPUs; {args.threads} "
             f"threads; date {date}; torch {version}",
             f"- {args.rounds} alternating rounds; GFLOP/s median (min–max) over rounds; decode "
             "rows (M <= 16) also give the weights' bf16 GB/s",
             "- shapes (N, K): q/k/v 3072×2048, o 2048×2048, gate/up 16384×2048, down 2048×8192 "
             "(Llama-3.2-1B layout)", "",
             "| M | N | K | amx | onednn | torch | amx / onednn | amx / torch |",
             "|---|---|---|---|---|---|---|---|"]
    for shape in shapes:
        a, am = cell("amx", shape)
        o, om = cell("onednn", shape)
        t, tm = cell("torch", shape)
        r1 = f"{am / om:.2f}×" if am and om else "–"
        r2 = f"{am / tm:.2f}×" if am and tm else "–"
        lines.append(f"| {shape[0]} | {shape[1]} | {shape[2]} | {a} | {o} | {t} | {r1} | {r2} |")
    lines += ["", f"bench wall time {time.time() - t0:.0f} s"]
    raw = {"date": date, "commit": args.commit, "threads": args.threads,
           "samples": {"/".join(map(str, k)): v for k, v in samples.items()}}
    write_results(args.out, "cpu_gemm_vs_torch", lines, raw)


if __name__ == "__main__":
    main()
