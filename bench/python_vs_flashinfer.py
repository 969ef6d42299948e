#!/usr/bin/env python3
"""pagoda.flashinfer vs FlashInfer 0.5.3 in one process, on the same CUDA tensors.

    PYTHONPATH=build/python python3 bench/python_vs_flashinfer.py [--cases a,b] [--rounds 7]
        [--iters 50] [--pagoda build/pagoda] [--json OUT.jsonl]

For each case (the shapes of bench/results/cuda_h200.md: decode, fp8 decode, prefill, extend,
MLA decode, MLA prefill) it builds one bf16 paged cache (shuffled pages, NHD, partial last pages
where the length says so) and the queries, then for both libraries (`import flashinfer` and
`import pagoda.flashinfer`):
  1. plan() with the same arguments; host time of plan() (median of --plan-reps calls);
  2. one run() each; outputs and LSEs compared (max abs error; bf16 tolerance 2e-2 relative to the
     output's scale, LSE 1e-2) -- a case whose outputs disagree is reported as FAIL;
  3. --rounds interleaved rounds (the order alternates per round), each timing --iters run()
     calls with CUDA events after a warm-up; per-call median over rounds and the spread
     (min..max of the round medians).
With --pagoda PATH it also runs `pagoda kernels --backend cuda --json` on the decode / extend
shapes (the same kernel launched from C++) for the "Python vs C++ within 3 %" target.
Prints a markdown table; --json appends one object per case. Needs torch with CUDA, flashinfer
0.5.3 and pagoda built with CUDA; FlashInfer JIT-compiles kernels on first use (minutes).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch

import flashinfer as fi
import pagoda.flashinfer as pf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda"))
from fi_jit import isolate_ninja_logs  # noqa: E402 - bench/cuda/fi_jit.py

isolate_ninja_logs()  # the kernels group's peers compiled FlashInfer's modules this way

DEV = "cuda"
BF16 = torch.bfloat16

# name: kind, batch, q_len, kv_len (incl. queries), page, hq, hkv, d(qk), dv, kv dtype
CASES = {
    "decode_p16_b64_l4096": ("decode", 64, 1, 4096, 16, 32, 8, 128, 128, BF16),
    "decode_p1_b64_l4096": ("decode", 64, 1, 4096, 1, 32, 8, 128, 128, BF16),
    "decode_p16_b8_l32768": ("decode", 8, 1, 32768, 16, 32, 8, 128, 128, BF16),
    "decode_fp8_p16_b64_l4096": ("decode", 64, 1, 4096, 16, 32, 8, 128, 128,
                                 torch.float8_e4m3fn),
    "prefill_causal_b4_s4096": ("prefill", 4, 4096, 4096, 16, 32, 8, 128, 128, BF16),
    "prefill_causal_b16_s1024": ("prefill", 16, 1024, 1024, 16, 32, 8, 128, 128, BF16),
    "extend_q512_prefix8192_p16": ("prefill", 4, 512, 8704, 16, 32, 8, 128, 128, BF16),
    "mla_decode_b64_l4096_h16": ("mla", 64, 1, 4096, 16, 16, 1, 576, 512, BF16),
    "mla_prefill_b4_s4096_h16": ("ragged", 4, 4096, 4096, 1, 16, 16, 192, 128, BF16),
}


def make_inputs(case, gen):
    kind, bs, qo, kv, page, hq, hkv, d, dv, kv_dtype = CASES[case]
    pages_per = (kv + page - 1) // page
    total = bs * pages_per + 8
    perm = torch.randperm(total, generator=gen).int()
    indptr = torch.arange(bs + 1, dtype=torch.int32) * pages_per
    indices = perm[: bs * pages_per].contiguous()
    last = torch.full((bs,), kv - (pages_per - 1) * page, dtype=torch.int32)
    qo_indptr = torch.arange(bs + 1, dtype=torch.int32) * qo
    t = {"indptr": indptr.to(DEV), "indices": indices.to(DEV), "last": last.to(DEV),
         "qo_indptr": qo_indptr.to(DEV), "kv_lens": torch.full((bs,), kv, dtype=torch.int32,
                                                              device=DEV)}
    if kind == "mla":
        latent = torch.randn(total, page, d, generator=gen).to(BF16).to(DEV)
        t["ckv"], t["kpe"] = latent[..., :dv], latent[..., dv:]  # one buffer (SGLang's layout)
        q = torch.randn(bs * qo, hq, d, generator=gen).to(BF16).to(DEV)
        t["q_nope"], t["q_pe"] = q[..., :dv].contiguous(), q[..., dv:].contiguous()
    elif kind == "ragged":
        t["k"] = torch.randn(bs * kv, hkv, d, generator=gen).to(BF16).to(DEV)
        t["v"] = torch.randn(bs * kv, hkv, dv, generator=gen).to(BF16).to(DEV)
        t["kv_indptr"] = (torch.arange(bs + 1, dtype=torch.int32) * kv).to(DEV)
        t["q"] = torch.randn(bs * qo, hq, d, generator=gen).to(BF16).to(DEV)
    else:
        k = torch.randn(total, page, hkv, d, generator=gen)
        v = torch.randn(total, page, hkv, dv, generator=gen)
        t["k"], t["v"] = k.to(kv_dtype).to(DEV), v.to(kv_dtype).to(DEV)
        t["q"] = torch.randn(bs * qo, hq, d, generator=gen).to(BF16).to(DEV)
    return t


def build(lib, case, t, ws):
    """(plan thunk, run thunk) of `lib` (flashinfer or pagoda.flashinfer) for the case."""
    kind, bs, qo, kv, page, hq, hkv, d, dv, kv_dtype = CASES[case]
    if kind == "decode":
        w = lib.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
        plan = lambda: w.plan(t["indptr"], t["indices"], t["last"], hq, hkv, d, page,
                              q_data_type=BF16, kv_data_type=kv_dtype)
        run = lambda: w.run(t["q"], (t["k"], t["v"]), return_lse=True)
    elif kind == "prefill":
        w = lib.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        plan = lambda: w.plan(t["qo_indptr"], t["indptr"], t["indices"], t["last"], hq, hkv, d,
                              page, causal=True, q_data_type=BF16, kv_data_type=kv_dtype)
        run = lambda: w.run(t["q"], (t["k"], t["v"]), return_lse=True)
    elif kind == "ragged":
        w = lib.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
        plan = lambda: w.plan(t["qo_indptr"], t["kv_indptr"], hq, hkv, d, head_dim_vo=dv,
                              causal=True, q_data_type=BF16)
        run = lambda: w.run(t["q"], t["k"], t["v"], return_lse=True)
    else:
        w = lib.BatchMLAPagedAttentionWrapper(ws)
        plan = lambda: w.plan(t["qo_indptr"], t["indptr"], t["indices"], t["kv_lens"], hq, dv,
                              d - dv, page, True, 1 / math.sqrt(d), BF16, BF16)
        run = lambda: w.run(t["q_nope"], t["q_pe"], t["ckv"], t["kpe"], return_lse=True)
    return plan, run


def plan_ms(plan, reps):
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        plan()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def time_run(run, iters):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        run()
    start.record()
    for _ in range(iters):
        run()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iters


def compare(a, b):
    (oa, la), (ob, lb) = a, b
    scale = max(1.0, ob.float().abs().max().item())
    o_err = (oa.float() - ob.float()).abs().max().item() / scale
    fin = torch.isfinite(lb)
    l_err = (la[fin] - lb[fin]).abs().max().item() if fin.any() else 0.0
    same_inf = torch.equal(torch.isfinite(la), fin)
    return o_err, l_err, o_err <= 2e-2 and l_err <= 1e-2 and same_inf


def cli_ms(pagoda, case):
    kind, bs, qo, kv, page, hq, hkv, d, dv, kv_dtype = CASES[case]
    if kind not in ("decode", "prefill"):
        return None
    kvd = "fp8_e4m3" if kv_dtype != BF16 else "bf16"
    cmd = [pagoda, "kernels", "--backend", "cuda", "--op", "decode" if kind == "decode" else
           "extend", "--batch", str(bs), "--kv-len", str(kv), "--q-len", str(qo), "--q-heads",
           str(hq), "--kv-heads", str(hkv), "--head-dim", str(d), "--page-size", str(page),
           "--kv-dtype", kvd, "--q-dtype", "bf16", "--json"]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return out.get("ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--plan-reps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pagoda", default=None, help="the pagoda CLI, for C++ kernel times")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    print(f"seed {a.seed}; torch {torch.__version__}; flashinfer {fi.__version__}; "
          f"{torch.cuda.get_device_name()}", flush=True)
    print("| case | check (o err, lse err) | pagoda run ms (spread) | flashinfer run ms (spread) "
          "| flashinfer / pagoda | pagoda plan ms | flashinfer plan ms | C++ kernel ms |")
    print("|---|---|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(a.seed)
    for case in a.cases.split(","):
        t = make_inputs(case, gen)
        libs = {}
        for name, lib in (("pagoda", pf), ("flashinfer", fi)):
            ws = torch.zeros(256 << 20, dtype=torch.uint8, device=DEV)
            plan, run = build(lib, case, t, ws)
            plan()
            libs[name] = {"plan": plan, "run": run, "plan_ms": plan_ms(plan, a.plan_reps)}
        o_err, l_err, ok = compare(libs["pagoda"]["run"](), libs["flashinfer"]["run"]())
        rounds = {"pagoda": [], "flashinfer": []}
        for r in range(a.rounds):
            order = ["pagoda", "flashinfer"] if r % 2 == 0 else ["flashinfer", "pagoda"]
            for name in order:
                rounds[name].append(time_run(libs[name]["run"], a.iters))
        med = {n: statistics.median(v) for n, v in rounds.items()}
        cpp = cli_ms(a.pagoda, case) if a.pagoda else None
        print(f"| {case} | {'ok' if ok else 'FAIL'} ({o_err:.1e}, {l_err:.1e}) | "
              f"{med['pagoda']:.3f} ({min(rounds['pagoda']):.3f}..{max(rounds['pagoda']):.3f}) | "
              f"{med['flashinfer']:.3f} ({min(rounds['flashinfer']):.3f}.."
              f"{max(rounds['flashinfer']):.3f}) | {med['flashinfer'] / med['pagoda']:.2f}x | "
              f"{libs['pagoda']['plan_ms']:.3f} | {libs['flashinfer']['plan_ms']:.3f} | "
              f"{'-' if cpp is None else f'{cpp:.3f}'} |", flush=True)
        if a.json:
            with open(a.json, "a") as fh:
                fh.write(json.dumps({"case": case, "ok": ok, "o_err": o_err, "lse_err": l_err,
                                     "pagoda_ms": rounds["pagoda"],
                                     "flashinfer_ms": rounds["flashinfer"],
                                     "pagoda_plan_ms": libs["pagoda"]["plan_ms"],
                                     "flashinfer_plan_ms": libs["flashinfer"]["plan_ms"],
                                     "cpp_kernel_ms": cpp}) + "\n")


if __name__ == "__main__":
    main()
