#!/usr/bin/env python3
"""FlashInfer 0.5.3 as a peer on pagoda's prefill / extend / tree-verify shapes (bench_cuda.cpp).

Usage: flashinfer_peer.py OUT.jsonl [name-filter[,name-filter...]]
FI_BACKENDS (default "fa3,fa2") names the backends to time.
Times BatchPrefillWithPagedKVCacheWrapper with backend "fa3" and "fa2" on a paged bf16 cache
(e4m3 for the "fp8kv" cases, which always time fa2 too) with shuffled pages (NHD), 32 q / 8 kv
heads (the MLA prefill cases: 16 / 16, head dims 192 / 128), causal, the same shapes as
bench_cuda.cpp. One JSON object per case: {"case", "fa3_ms", "fa2_ms"}
(median of triton.testing.do_bench; null when the backend refuses); where the paged wrapper
refuses a case, BatchPrefillWithRaggedKVCacheWrapper on contiguous K/V is tried as
"<backend>_ragged_ms". FlashInfer JIT-compiles each kernel variant on first use (about a minute)."""
import json
import os
import sys

import torch
from triton.testing import do_bench

import flashinfer

dev = "cuda"
bf = torch.bfloat16
CASES = [  # name, bs, qo, prefix, page, d, tree[, hq, hkv, dv]
    ("prefill_causal_b4_s4096", 4, 4096, 0, 16, 128, False),
    ("prefill_causal_b1_s16384", 1, 16384, 0, 16, 128, False),
    ("prefill_causal_b16_s1024", 16, 1024, 0, 16, 128, False),
    ("prefill_causal_b1_s4096", 1, 4096, 0, 16, 128, False),
    ("prefill_causal_b4_s4096_p1", 4, 4096, 0, 1, 128, False),
    ("prefill_causal_b4_s4096_d64", 4, 4096, 0, 16, 64, False),
    ("extend_q512_prefix8192_p16", 4, 512, 8192, 16, 128, False),
    ("tree_verify_d64_prefix4096_b16", 16, 64, 4096, 16, 128, True),
    ("prefill_causal_b4_s4096_d256", 4, 4096, 0, 16, 256, False),
    ("mla_prefill_b4_s4096_h16", 4, 4096, 0, 16, 192, False, 16, 16, 128),
    ("mla_prefill_b1_s8192_h16", 1, 8192, 0, 16, 192, False, 16, 16, 128),
    ("mla_extend_q512_prefix8192_h16", 4, 512, 8192, 16, 192, False, 16, 16, 128),
    # fp8 e4m3 K/V cache with bf16 queries (the "fp8kv" prefix picks the cache type), last: a
    # backend may refuse them, and their JIT builds come after every bf16 case's.
    ("fp8kv_causal_b4_s4096", 4, 4096, 0, 16, 128, False),
    ("fp8kv_ext_q512_prefix8192", 4, 512, 8192, 16, 128, False),
]


def run_ragged(bs, qo, prefix, d, hq, hkv, dv, backend, ws):
    kv = prefix + qo
    qo_indptr = torch.arange(0, bs + 1, dtype=torch.int32, device=dev) * qo
    kv_indptr = torch.arange(0, bs + 1, dtype=torch.int32, device=dev) * kv
    q = torch.randn(bs * qo, hq, d, device=dev, dtype=bf)
    k = torch.randn(bs * kv, hkv, d, device=dev, dtype=bf)
    v = torch.randn(bs * kv, hkv, dv, device=dev, dtype=bf)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
    w.plan(qo_indptr, kv_indptr, hq, hkv, d, head_dim_vo=dv, causal=True,
           q_data_type=bf, kv_data_type=bf)
    fn = lambda: w.run(q, k, v)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def run(name, bs, qo, prefix, ps, d, tree, hq=32, hkv=8, dv=None, *, backend, ws):
    dv = dv or d
    kv = prefix + qo
    pages = (kv + ps - 1) // ps
    num = bs * pages + 1
    g = torch.Generator(device="cpu").manual_seed(42)
    ids = (torch.randperm(num - 1, generator=g) + 1).to(torch.int32).to(dev)
    kv_indptr = torch.arange(0, bs + 1, dtype=torch.int32, device=dev) * pages
    last = torch.full((bs,), kv - (pages - 1) * ps, dtype=torch.int32, device=dev)
    qo_indptr = torch.arange(0, bs + 1, dtype=torch.int32, device=dev) * qo
    kvt = torch.float8_e4m3fn if name.startswith("fp8kv") else bf
    q = torch.randn(bs * qo, hq, d, device=dev, dtype=bf)
    kc = torch.randn(num, ps, hkv, d, device=dev, dtype=bf).to(kvt)
    vc = torch.randn(num, ps, hkv, dv, device=dev, dtype=bf).to(kvt)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
    kwargs = {}
    if tree:
        masks = []
        for _ in range(bs):
            parent = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, qo)]
            m = torch.zeros(qo, kv, dtype=torch.bool)
            m[:, :prefix] = True
            for i in range(qo):
                a = i
                while a >= 0:
                    m[i, prefix + a] = True
                    a = parent[a]
            masks.append(m.flatten())
        kwargs["custom_mask"] = torch.cat(masks).to(dev)
    if dv != d:
        kwargs["head_dim_vo"] = dv
    w.plan(qo_indptr, kv_indptr, ids, last, hq, hkv, d, ps, causal=not tree,
           q_data_type=bf, kv_data_type=kvt, **kwargs)
    fn = lambda: w.run(q, (kc, vc))  # noqa: E731
    fn()
    torch.cuda.synchronize()
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def main():
    out = open(sys.argv[1], "w")
    filters = [f for f in (sys.argv[2] if len(sys.argv) > 2 else "").split(",") if f]
    backends = [b for b in os.environ.get("FI_BACKENDS", "fa3,fa2").split(",") if b]
    ws = torch.empty(512 << 20, dtype=torch.uint8, device=dev)
    for case in CASES:
        if filters and not any(f in case[0] for f in filters):
            continue
        r = {"case": case[0]}
        fp8_extra = ["fa2"] if case[0].startswith("fp8kv") and "fa2" not in backends else []
        for backend in backends + fp8_extra:
            try:
                r[f"{backend}_ms"] = run(*case, backend=backend, ws=ws)
            except Exception as e:  # noqa: BLE001 - a refusal is reported, not fatal
                print(f"{case[0]} {backend} failed: {type(e).__name__} {str(e)[:200]}", flush=True)
                r[f"{backend}_ms"] = None
                if len(case) > 7:  # head dims the paged wrapper may refuse: contiguous K/V
                    name, bs, qo, prefix, _ps, d, _tree, hq, hkv, dv = case
                    try:
                        r[f"{backend}_ragged_ms"] = run_ragged(bs, qo, prefix, d, hq, hkv, dv,
                                                               backend, ws)
                    except Exception as e2:  # noqa: BLE001
                        print(f"{name} {backend} ragged failed: {type(e2).__name__} "
                              f"{str(e2)[:200]}", flush=True)
                        r[f"{backend}_ragged_ms"] = None
        print(json.dumps(r), flush=True)
        out.write(json.dumps(r) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
