#!/usr/bin/env python3
"""pagoda CPU backend vs PyTorch CPU scaled_dot_product_attention on the same shapes.

Runs `pagoda kernels --json` for each (op, threads) and times torch SDPA (bf16, contiguous KV,
same thread count, warm-up then median). Bytes and FLOPs use the same formulas as pagoda
(decode bytes = Q + K + V + O; FLOPs over visible (query, key) pairs = 4·pairs·H·D).
Each pagoda shape also runs with `--kernel-option cpu_bf16=0` (the f32 kernels without
AVX512-BF16 dot products: the previous code path) in the same session, for an old/new comparison,
and each decode shape with `--kernel-option cpu_bf16_decode=1` (the opt-in AVX512-BF16 decode).
With --amx each extend shape also runs on the `amx` backend (bf16 matmuls through oneDNN: AMX
tiles on Sapphire Rapids; its decode is the cpu kernels', so decode shapes are not repeated).
Writes cpu_vs_torch.md and cpu_vs_torch.json into --out.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import time

SHAPES = [
    # op, batch, kv_len, q_len, q_heads, kv_heads, head_dim, page_size
    ("decode", 16, 8192, 1, 32, 8, 128, 16),
    ("extend", 1, 1024, 1024, 32, 8, 128, 16),
    # issue 51's targets: an extend of 512 queries on 4,096 keys (B4) and a 2,048-token prefill
    ("extend", 4, 4096, 512, 32, 8, 128, 16),
    ("extend", 1, 2048, 2048, 32, 8, 128, 16),
]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    fl = line.split(":", 1)[1].split()
                    return sorted(x for x in fl if x.startswith(("avx512", "amx")))
    except OSError:
        pass
    return []


def run_pagoda(exe, shape, threads, iters, kernel_options=(), backend="cpu"):
    op, b, l, q, hq, hk, d, p = shape
    cmd = [exe, "kernels", "--backend", backend, "--op", op, "--batch", str(b), "--kv-len", str(l),
           "--q-len", str(q), "--q-heads", str(hq), "--kv-heads", str(hk), "--head-dim", str(d),
           "--page-size", str(p), "--kv-dtype", "bf16", "--threads", str(threads),
           "--iters", str(iters), "--json"]
    for option in kernel_options:
        cmd += ["--kernel-option", option]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def time_ms(fn, iters):
    """The wall times of `iters` calls of fn, in ms."""
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return ts


def time_torch(shape, threads, iters):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    op, b, l, q, hq, hk, d, _ = shape
    g = torch.Generator().manual_seed(0)
    qt = torch.rand(b, hq, q, d, generator=g).sub_(0.5).to(torch.bfloat16)
    kt = torch.rand(b, hk, l, d, generator=g).sub_(0.5).to(torch.bfloat16)
    vt = torch.rand(b, hk, l, d, generator=g).sub_(0.5).to(torch.bfloat16)
    causal = op != "decode"
    # An extend's queries are the last q of the l positions: query i sees keys [0, l - q + i]
    # (bottom-right causal; torch's is_causal aligns top-left, so q < l needs the mask).
    mask = (torch.ones(q, l, dtype=torch.bool).tril(l - q) if causal and q < l else None)
    if mask is not None:
        causal = False
    variants = {}

    def bench(fn):
        with torch.inference_mode():
            for _ in range(3):
                fn()
            return statistics.median(time_ms(fn, iters))

    try:
        variants["sdpa_enable_gqa"] = bench(
            lambda: F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=causal,
                                                   enable_gqa=True))
    except Exception as e:  # older torch or unsupported path
        variants["sdpa_enable_gqa_error"] = str(e)
    ke = kt.repeat_interleave(hq // hk, dim=1).contiguous()
    ve = vt.repeat_interleave(hq // hk, dim=1).contiguous()
    variants["sdpa_expanded_kv"] = bench(
        lambda: F.scaled_dot_product_attention(qt, ke, ve, attn_mask=mask, is_causal=causal))
    del ke, ve
    timed = {k: v for k, v in variants.items() if isinstance(v, float)}
    best = min(timed, key=timed.get)
    return timed[best], best, variants, torch.__version__


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", nargs="*", type=int, default=[])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--no-ab", action="store_true", help="skip the cpu_bf16=0 and cpu_bf16_decode=1 runs")
    ap.add_argument("--amx", action="store_true", help="also time the amx backend on extend shapes")
    args = ap.parse_args()
    t_start = time.time()
    threads = args.threads or [2, os.cpu_count() or 2]
    rows, raw = [], []
    torch_version = "?"
    for t in threads:
        for shape in SHAPES:
            ours = run_pagoda(args.pagoda, shape, t, args.iters)
            old = None if args.no_ab else run_pagoda(args.pagoda, shape, t, args.iters,
                                                     kernel_options=["cpu_bf16=0"])
            dec16 = None
            if not args.no_ab and shape[0] == "decode":  # the opt-in AVX512-BF16 decode kernels
                dec16 = run_pagoda(args.pagoda, shape, t, args.iters,
                                   kernel_options=["cpu_bf16_decode=1"])
            amx = None
            if args.amx and shape[0] != "decode":
                amx = run_pagoda(args.pagoda, shape, t, args.iters, backend="amx")
            torch_ms, variant, variants, torch_version = time_torch(shape, t, args.iters)
            memory = shape[0] == "decode"
            unit = "GB/s" if memory else "TFLOP/s"
            ours_rate = ours["gbps"] if memory else ours["tflops"]
            scale = ours["ms"] / torch_ms
            torch_rate = ours_rate * scale
            rows.append((t, shape, ours, ours_rate, torch_ms, torch_rate, variant, unit, old))
            raw.append({"threads": t, "shape": shape, "pagoda": ours, "pagoda_f32_path": old,
                        "pagoda_bf16_decode": dec16, "pagoda_amx": amx,
                        "torch_ms": torch_ms, "torch_variant": variant,
                        "torch_variants": variants})
            print(f"threads={t} {shape[0]}: pagoda {ours['ms']:.3f} ms ({ours_rate:.3f} {unit}, "
                  f"{ours['pct_of_peak']:.1f}% of peak {ours['peak']:.2f}), torch {torch_ms:.3f} ms "
                  f"({variant}), speedup {torch_ms / ours['ms']:.2f}x"
                  + (f"; f32 path {old['ms']:.3f} ms" if old else "")
                  + (f"; bf16 decode {dec16['ms']:.3f} ms" if dec16 else "")
                  + (f"; amx {amx['ms']:.3f} ms" if amx else ""), flush=True)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# pagoda CPU backend vs PyTorch SDPA (CPU)",
        "",
        f"- machine: {cpu_model()}, {os.cpu_count()} logical CPUs; date {date}",
        f"- CPU flags: {' '.join(cpu_flags()) or '?'}",
        f"- torch {torch_version}; pagoda SIMD target {rows[0][2].get('simd', '?')}",
        "- bf16 q/k/v/out; pagoda reads a paged cache (page 16, shuffled pages), torch contiguous "
        "[B, H, L, D] KV; decode: B=16, L=8192, 32/8 heads, D=128; extend: B=1, q=kv=1024 causal",
        "- peak = same run's streaming-read GB/s (decode) or OpenBLAS sgemm TFLOP/s (extend)",
        "- f32 path = the same binary with --kernel-option cpu_bf16=0 (no AVX512-BF16 kernels), "
        "same session",
        "",
        "| threads | op | pagoda ms | pagoda rate | % of peak | f32 path ms | torch ms | torch rate "
        "| torch variant | speedup (torch ms / pagoda ms) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t, shape, ours, rate, tms, trate, variant, unit, old in rows:
        old_ms = f"{old['ms']:.3f}" if old else "-"
        lines.append(f"| {t} | {shape[0]} | {ours['ms']:.3f} | {rate:.3f} {unit} | "
                     f"{ours['pct_of_peak']:.1f} % of {ours['peak']:.2f} | {old_ms} | {tms:.3f} | "
                     f"{trate:.3f} {unit} | {variant} | {tms / ours['ms']:.2f}x |")
    for r in raw:
        if r["pagoda_bf16_decode"]:
            d = r["pagoda_bf16_decode"]
            lines.append(f"- {r['threads']} threads, decode with cpu_bf16_decode=1: "
                         f"{d['ms']:.3f} ms, {d['gbps']:.3f} GB/s, {d['pct_of_peak']:.1f} % of "
                         f"{d['peak']:.2f}")
        if r["pagoda_amx"]:
            a = r["pagoda_amx"]
            lines.append(f"- {r['threads']} threads, {r['shape'][0]} on the amx backend: "
                         f"{a['ms']:.3f} ms, {a['tflops']:.3f} TFLOP/s (torch "
                         f"{r['torch_ms']:.3f} ms: {r['torch_ms'] / a['ms']:.2f}x)")
    lines.append("")
    lines.append(f"bench wall time {time.time() - t_start:.0f} s (after the build)")
    write_results(args.out, "cpu_vs_torch", lines, raw)


def write_results(out, stem, lines, raw):
    """Writes <out>/<stem>.md (the lines) and <out>/<stem>.json (raw), and prints the lines."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, stem + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, stem + ".json"), "w") as f:
        json.dump(raw, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
