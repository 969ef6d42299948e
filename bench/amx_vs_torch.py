#!/usr/bin/env python3
"""pagoda's `amx` backend vs PyTorch CPU scaled_dot_product_attention on issue 51's shapes.

Runs `pagoda kernels --backend amx --op OP --json` for each shape (extend / prefill, and the
B16 × 8,192 decode, whose rows also give the share of each run's memcpy bandwidth: issue 51's
decode target is >= 70 %) and times torch SDPA (bf16,
contiguous [B, H, L, D] KV, the same thread count), in interleaved rounds (pagoda binaries, then
torch, again and again) so that load from other processes falls on every side alike; reports the
median, min and max of all timed samples. Causal is bottom-right (the queries are the last q_len
of kv_len keys): torch gets `is_causal=True` where q_len == kv_len, else the lower-right causal
mask (torch.nn.attention.bias.causal_lower_right, and a materialized boolean mask; the faster of
the two is reported, as is the faster of enable_gqa and KV expanded to every query head).
--baseline adds a second pagoda binary (e.g. one built from an older commit) to the same rounds;
--kernel-option passes options to every pagoda run (e.g. amx_tiles=0).

torch is a test client only (pip install torch; nothing in pagoda needs it).
Writes amx_vs_torch.md and amx_vs_torch.json into --out.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import time

from cpu_vs_torch import cpu_model, time_ms, write_results  # this folder is on sys.path when run

SHAPES = [
    # op, batch, kv_len, q_len, q_heads, kv_heads, head_dim, page_size
    ("extend", 1, 1024, 1024, 32, 8, 128, 16),
    ("extend", 1, 2048, 2048, 32, 8, 128, 16),
    ("extend", 4, 4096, 512, 32, 8, 128, 16),
    ("decode", 16, 8192, 1, 32, 8, 128, 16),
]


def run_pagoda(exe, shape, threads, iters, options):
    op, b, l, q, hq, hk, d, p = shape
    cmd = [exe, "kernels", "--backend", "amx", "--op", op, "--batch", str(b), "--kv-len",
           str(l), "--q-len", str(q), "--q-heads", str(hq), "--kv-heads", str(hk), "--head-dim",
           str(d), "--page-size", str(p), "--kv-dtype", "bf16", "--threads", str(threads),
           "--iters", str(iters), "--warmup", "2", "--json"]
    for o in options:
        cmd += ["--kernel-option", o]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def torch_timer(shape, threads):
    """Returns fn(iters) -> {variant: [ms, ...]} for this shape."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    torch.set_num_threads(threads)
    op, b, l, q, hq, hk, d, _ = shape
    g = torch.Generator().manual_seed(0)
    qt = torch.rand(b, hq, q, d, generator=g).sub_(0.5).to(torch.bfloat16)
    kt = torch.rand(b, hk, l, d, generator=g).sub_(0.5).to(torch.bfloat16)
    vt = torch.rand(b, hk, l, d, generator=g).sub_(0.5).to(torch.bfloat16)
    ke = kt.repeat_interleave(hq // hk, dim=1).contiguous()
    ve = vt.repeat_interleave(hq // hk, dim=1).contiguous()
    if op == "decode":
        masks = {"no_mask": {}}
    elif q == l:
        masks = {"is_causal": dict(is_causal=True)}
    else:
        masks = {"lower_right": dict(attn_mask=causal_lower_right(q, l)),
                 "bool_mask": dict(attn_mask=torch.ones(q, l, dtype=torch.bool).tril(l - q))}
    variants = {}
    for mname, kw in masks.items():
        variants[f"gqa_{mname}"] = (lambda kw=kw: F.scaled_dot_product_attention(
            qt, kt, vt, enable_gqa=True, **kw))
        variants[f"expanded_{mname}"] = (lambda kw=kw: F.scaled_dot_product_attention(
            qt, ke, ve, **kw))

    def run(iters):
        res = {}
        with torch.inference_mode():
            for name, fn in variants.items():
                fn()
                res[name] = time_ms(fn, iters)
        return res

    run(1)  # warm-up
    return run, torch.__version__


def stats(samples):
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "n": len(samples)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--baseline", help="a second pagoda binary timed in the same rounds")
    ap.add_argument("--baseline-label", default="baseline")
    ap.add_argument("--label", default="pagoda amx")
    ap.add_argument("--kernel-option", action="append", default=[])
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--ops", nargs="*", default=["extend", "decode"],
                    help="the shapes' ops to run (extend, decode)")
    args = ap.parse_args()
    t_start = time.time()
    rows, raw = [], []
    torch_version = "?"
    for shape in (s for s in SHAPES if s[0] in args.ops):
        timer, torch_version = torch_timer(shape, args.threads)
        ours, base, torch_samples, copy_pct = [], [], {}, []
        for _ in range(args.rounds):
            run = run_pagoda(args.pagoda, shape, args.threads, args.iters, args.kernel_option)
            ours += run["samples_ms"]
            if shape[0] == "decode":  # this run's bytes at its median over its memcpy rate
                copy_pct.append(run["pct_of_copy"])
            if args.baseline:
                base += run_pagoda(args.baseline, shape, args.threads, args.iters,
                                   args.kernel_option)["samples_ms"]
            for k, v in timer(args.iters).items():
                torch_samples.setdefault(k, []).extend(v)
        best = min(torch_samples, key=lambda k: statistics.median(torch_samples[k]))
        s_ours, s_torch = stats(ours), stats(torch_samples[best])
        s_base = stats(base) if base else None
        rows.append((shape, s_ours, s_base, s_torch, best, copy_pct))
        raw.append({"shape": shape, "pagoda_ms": ours, "baseline_ms": base,
                    "torch_ms": torch_samples, "torch_best": best,
                    "pagoda_pct_of_copy": copy_pct})
        print(f"{shape}: ours {s_ours['median']:.2f} ms, torch {s_torch['median']:.2f} ms ({best})"
              + (f", baseline {s_base['median']:.2f} ms" if s_base else ""), flush=True)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")

    def cell(s):
        return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"

    head = "| shape (B, kv, q; 32/8 heads, D 128, page 16; extend causal bottom-right) | "
    head += (f"{args.baseline_label} ms | " if args.baseline else "")
    head += f"{args.label} ms | torch ms | torch variant | torch / {args.label}"
    head += (f" | torch / {args.baseline_label}" if args.baseline else "")
    head += f" | {args.label} % of memcpy (per round) |"
    lines = [
        "# pagoda `amx` backend vs PyTorch SDPA (CPU), extend / prefill / decode",
        "",
        f"- machine: {cpu_model()}, {os.cpu_count()} logical CPUs; date {date}; "
        f"{args.threads} threads (OMP_NUM_THREADS)",
        f"- torch {torch_version}; bf16 q/k/v/out; pagoda reads a paged cache (page 16, shuffled "
        "pages), torch contiguous [B, H, L, D] KV",
        f"- {args.rounds} interleaved rounds of {args.iters} timed runs per side; cells: median "
        "(min–max) over all samples" + (f"; pagoda kernel options {args.kernel_option}"
                                        if args.kernel_option else ""),
        "",
        head,
        "|" + "---|" * (head.count("|") - 1),
    ]
    for shape, so, sb, st, best, pct in rows:
        op, b, l, q = shape[:4]
        line = f"| {op} B{b}, kv {l}, q {q} | " + (f"{cell(sb)} | " if sb else "")
        line += f"{cell(so)} | {cell(st)} | {best} | {st['median'] / so['median']:.2f}x"
        line += (f" | {st['median'] / sb['median']:.2f}x" if sb else "")
        line += " | " + (", ".join(f"{x:.1f}" for x in pct) if pct else "-") + " |"
        lines.append(line)
    lines += ["", f"bench wall time {time.time() - t_start:.0f} s"]
    write_results(args.out, "amx_vs_torch", lines, raw)


if __name__ == "__main__":
    main()
