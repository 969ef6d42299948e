#!/usr/bin/env python3
"""The peers of pagoda's kernel benchmark, on the shapes of bench/cuda/cases.json.

Usage: peers.py CASES.json OUT.jsonl [--peers cudnn,flash,flashinfer] [--filter S[,S...]]
                [--only NAME[,NAME...]] [--ceilings]

--filter keeps the cases whose name contains one of the strings, --only the cases named exactly.

Writes one JSON object per (case, peer): {"case", "peer", "ms", "samples_ms"}; where the peer
refuses the case {"case", "peer", "error"}, where it has no such kernel at all {"case", "peer",
"skipped"}; with --ceilings first {"ceiling": "copy_gbps" |
"gemm_tflops", "value"} (device-to-device copy, read + write; bf16 GEMM 8192^3 through torch).

Peers:
  cudnn, flash  torch scaled_dot_product_attention with the cuDNN / flash backend on contiguous
                K/V (SDPA has no page table), bf16 only; prefill and decode cases (SDPA's causal
                mask is top-left aligned, so cases with both a prefix and several queries are
                not theirs); MLA prefill (Dqk != Dv) with cuDNN only.
  flashinfer    FlashInfer on the same paged layout as pagoda (NHD, shuffled pages, random data):
                BatchDecodeWithPagedKVCacheWrapper for decode, BatchPrefillWithPagedKVCacheWrapper
                for prefill / extend / tree verify (the case's mask bits for trees) with the
                Hopper backend "fa3" (its fastest here), or "fa2" where fa3 refuses the case,
                BatchMLAPagedAttentionWrapper for absorbed MLA decode; peer names
                "flashinfer_fa3" / "flashinfer_fa2" for prefill, "flashinfer" otherwise. A shape
                the paged prefill wrapper refuses is retried on contiguous K/V
                (BatchPrefillWithRaggedKVCacheWrapper) as "flashinfer_<backend>_ragged".

Timing policy (the same as pagoda_cuda_bench's, bench/cuda/bench_cuda.cpp): 3 untimed warm-up
calls, then 30 timed calls, each preceded by zeroing a 256 MiB device buffer (what
triton.testing.do_bench does before every repetition) and timed alone between two CUDA events
on the current stream; median reported with every sample. Inputs are torch.randn (bf16, or
bf16 cast to e4m3 for fp8 KV), never constant. FlashInfer JIT-compiles each kernel variant on
its first use (about a minute each); bench/device/run.sh runs this script once per round, so
only the first round pays for it."""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from cases import kind, load_cases  # bench/cuda/cases.py, beside this file
from fi_jit import isolate_ninja_logs  # bench/cuda/fi_jit.py

DEV = "cuda"
BF = torch.bfloat16
WARMUP, ITERS = 3, 30
FLUSH = None  # the 256 MiB buffer zeroed before every timed call


def time_samples(fn):
    """Every timed call's milliseconds under the policy above."""
    global FLUSH
    if FLUSH is None:
        FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device=DEV)
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(ITERS):
        FLUSH.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out


def paged(c, gen):
    """pagoda's layout: every request owns ceil(kv / page) shuffled pages of a pool."""
    kv = c["prefix"] + c["qo"]
    ps = c["page"]
    pages = (kv + ps - 1) // ps
    num = c["batch"] * pages + 1
    ids = (torch.randperm(num - 1, generator=gen) + 1).to(torch.int32).to(DEV)
    kv_indptr = torch.arange(0, c["batch"] + 1, dtype=torch.int32, device=DEV) * pages
    last = torch.full((c["batch"],), kv - (pages - 1) * ps, dtype=torch.int32, device=DEV)
    return kv, num, ids, kv_indptr, last


def kv_type(c):
    return torch.float8_e4m3fn if c["kv"].startswith("fp8") else BF


def tree_mask(c, gen):
    """The random draft tree bench_cuda.cpp builds: prefix visible, each draft its ancestors."""
    kv = c["prefix"] + c["qo"]
    masks = []
    for _ in range(c["batch"]):
        parent = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, c["qo"])]
        m = torch.zeros(c["qo"], kv, dtype=torch.bool)
        m[:, : c["prefix"]] = True
        for i in range(c["qo"]):
            a = i
            while a >= 0:
                m[i, c["prefix"] + a] = True
                a = parent[a]
        masks.append(m.flatten())
    return torch.cat(masks).to(DEV)


class NotApplicable(Exception):
    """The peer does not implement this kind of case (a row "skipped", not a refusal)."""


def sdpa_fn(backend, c):
    if c["kv"] != "bf16":
        raise NotApplicable("SDPA takes no fp8 K/V")
    if kind(c) not in ("prefill", "decode"):
        raise NotApplicable("SDPA's causal mask is top-left aligned: prefill and decode only")
    d, dv = c["d"], c["dv"] or c["d"]
    s_q, s_kv = c["qo"], c["prefix"] + c["qo"]
    q = torch.randn(c["batch"], c["hq"], s_q, d, device=DEV, dtype=BF)
    k = torch.randn(c["batch"], c["hkv"], s_kv, d, device=DEV, dtype=BF)
    v = torch.randn(c["batch"], c["hkv"], s_kv, dv, device=DEV, dtype=BF)
    causal = s_q > 1

    def fn():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    return fn


def flashinfer_fns(c, ws):
    """(peer name, callable) pairs of FlashInfer for one case; raises where none applies."""
    import flashinfer  # noqa: PLC0415 - optional peer, carried as wheels

    isolate_ninja_logs()

    gen = torch.Generator(device="cpu").manual_seed(42)
    kv, num, ids, kv_indptr, last = paged(c, gen)
    kvt = kv_type(c)
    b, ps, hq, hkv, d = c["batch"], c["page"], c["hq"], c["hkv"], c["d"]
    dv = c["dv"] or d
    if kind(c) == "mla_decode":
        qo_indptr = torch.arange(0, b + 1, dtype=torch.int32, device=DEV)
        kv_lens = torch.full((b,), kv, dtype=torch.int32, device=DEV)
        rope = d - dv
        q_nope = torch.randn(b, hq, dv, device=DEV, dtype=BF)
        q_pe = torch.randn(b, hq, rope, device=DEV, dtype=BF)
        ckv = torch.randn(num, ps, dv, device=DEV, dtype=BF).to(kvt)
        kpe = torch.randn(num, ps, rope, device=DEV, dtype=BF).to(kvt)
        w = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws, backend="auto")
        w.plan(qo_indptr, kv_indptr, ids, kv_lens, hq, dv, rope, ps, False, d ** -0.5, BF, kvt)
        return [("flashinfer", lambda: w.run(q_nope, q_pe, ckv, kpe))]
    kc = torch.randn(num, ps, hkv, d, device=DEV, dtype=BF).to(kvt)
    vc = torch.randn(num, ps, hkv, dv, device=DEV, dtype=BF).to(kvt)
    if kind(c) == "decode":
        q = torch.randn(b, hq, d, device=DEV, dtype=BF)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
        w.plan(kv_indptr, ids, last, hq, hkv, d, ps, q_data_type=BF, kv_data_type=kvt)
        return [("flashinfer", lambda: w.run(q, (kc, vc)))]
    qo_indptr = torch.arange(0, b + 1, dtype=torch.int32, device=DEV) * c["qo"]
    q = torch.randn(b * c["qo"], hq, d, device=DEV, dtype=BF)
    kwargs = {"custom_mask": tree_mask(c, gen)} if c["tree"] else {}
    if dv != d:
        kwargs["head_dim_vo"] = dv
    for backend in ("fa3", "fa2"):  # fa2 only where fa3 refuses
        name = f"flashinfer_{backend}"
        try:
            w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
            w.plan(qo_indptr, kv_indptr, ids, last, hq, hkv, d, ps, causal=not c["tree"],
                   q_data_type=BF, kv_data_type=kvt, **kwargs)
            fn = lambda w=w: w.run(q, (kc, vc))  # noqa: E731
            fn()  # a backend may accept the plan and refuse the run
            return [(name, fn)]
        except Exception as e:  # noqa: BLE001 - the ragged wrapper below, or the next backend
            print(f"{c['name']} {name} paged refused: {type(e).__name__} {str(e)[:160]}",
                  flush=True)
        if kvt != BF:
            continue
        try:
            rk = torch.randn(b * kv, hkv, d, device=DEV, dtype=BF)
            rv = torch.randn(b * kv, hkv, dv, device=DEV, dtype=BF)
            ragged_indptr = torch.arange(0, b + 1, dtype=torch.int32, device=DEV) * kv
            w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
            w.plan(qo_indptr, ragged_indptr, hq, hkv, d, causal=not c["tree"], q_data_type=BF,
                   kv_data_type=BF, **kwargs)
            fn = lambda w=w, rk=rk, rv=rv: w.run(q, rk, rv)  # noqa: E731
            fn()
            return [(name + "_ragged", fn)]
        except Exception as e:  # noqa: BLE001 - the next backend
            print(f"{c['name']} {name} ragged refused: {type(e).__name__} {str(e)[:160]}",
                  flush=True)
    raise ValueError("every FlashInfer prefill backend refused this case")


def ceilings():
    n = 1 << 30
    a = torch.randn(n // 2, device=DEV, dtype=BF)
    b = torch.empty_like(a)
    copy_ms = sorted(time_samples(lambda: b.copy_(a)))[ITERS // 2]
    del a, b
    m = 8192
    x = torch.randn(m, m, device=DEV, dtype=BF)
    y = torch.randn(m, m, device=DEV, dtype=BF)
    gemm_ms = sorted(time_samples(lambda: x @ y))[ITERS // 2]
    return {"copy_gbps": 2 * n / (copy_ms * 1e-3) / 1e9,
            "gemm_tflops": 2 * m ** 3 / (gemm_ms * 1e-3) / 1e12}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cases")
    ap.add_argument("out")
    ap.add_argument("--peers", default="cudnn,flash,flashinfer")
    ap.add_argument("--filter", default="")
    ap.add_argument("--only", default="")
    ap.add_argument("--ceilings", action="store_true")
    a = ap.parse_args()
    peers = [p for p in a.peers.split(",") if p]
    filters = [f for f in a.filter.split(",") if f]
    only = {f for f in a.only.split(",") if f}
    out = open(a.out, "w")

    def emit(r):
        print(json.dumps(r)[:300], flush=True)
        out.write(json.dumps(r) + "\n")
        out.flush()

    torch.manual_seed(0)
    if a.ceilings:
        for k, v in ceilings().items():
            emit({"ceiling": k, "value": v})
    ws = torch.empty(512 << 20, dtype=torch.uint8, device=DEV)
    sdpa = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    for c in load_cases(a.cases):
        if (filters and not any(f in c["name"] for f in filters)) or (only and c["name"] not in only):
            continue
        t_case = time.perf_counter()
        for peer in peers:
            try:
                if peer in sdpa:
                    if peer == "flash" and (c["dv"] or c["d"]) != c["d"]:
                        raise NotApplicable("flash SDPA needs equal Q/K and V head dims")
                    fns = [(peer, sdpa_fn(sdpa[peer], c))]
                elif peer == "flashinfer":
                    fns = flashinfer_fns(c, ws)
                else:
                    raise SystemExit(f"unknown peer {peer}")
            except NotApplicable as e:
                emit({"case": c["name"], "peer": peer, "skipped": str(e)})
                continue
            except Exception as e:  # noqa: BLE001 - a refusal is a row, not a failure
                emit({"case": c["name"], "peer": peer, "error": f"{type(e).__name__}: {str(e)[:200]}"})
                continue
            for name, fn in fns:
                try:
                    s = time_samples(fn)
                    emit({"case": c["name"], "peer": name, "ms": sorted(s)[len(s) // 2],
                          "samples_ms": s})
                except Exception as e:  # noqa: BLE001
                    emit({"case": c["name"], "peer": name,
                          "error": f"{type(e).__name__}: {str(e)[:200]}"})
            torch.cuda.empty_cache()
        print(f"case {c['name']}: {time.perf_counter() - t_case:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
