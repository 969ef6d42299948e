#!/usr/bin/env python3
"""PyTorch peers on pagoda's CUDA benchmark shapes, plus the machine's measured ceilings.

Usage: peers.py OURS.jsonl OUT.md GPU.txt
       peers.py --mla MLA.jsonl OUT.md GPU.txt
Reads pagoda's timings (bench_cuda.cpp), times cuDNN and flash scaled_dot_product_attention on
contiguous KV, flex_attention, and a gather-then-SDPA paged baseline on the same shapes, measures
device copy bandwidth and the bf16 GEMM rate, and writes a Markdown table with ratios.
Ratios are peer_ms / ours_ms (> 1: pagoda faster). Medians of triton.testing.do_bench.

--mla: MLA.jsonl holds `pagoda kernels --backend cuda --json` lines of absorbed-MLA decode shapes
(Dqk 576 / Dv 512, kv heads 1), each tagged with a "variant" (the settings it ran under,
scripts/h200_mla.sh); FlashInfer 0.5.3's flashinfer.mla.BatchMLAPagedAttentionWrapper (backends
FI_MLA_BACKENDS, default "fa3") is timed once per shape (paged, shuffled pages; n/a when
flashinfer is missing or refuses)."""
import datetime
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

torch.manual_seed(0)
dev = "cuda"
bf = torch.bfloat16


def bench(fn):
    fn()
    torch.cuda.synchronize()
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def try_bench(fn):
    try:
        return bench(fn)
    except Exception as e:  # noqa: BLE001 - report any backend refusal as n/a
        print("  peer failed:", type(e).__name__, str(e).split("\n")[0][:160])
        return None


def ceilings():
    n = 1 << 30  # 1 GiB per buffer
    a = torch.randn(n // 2, device=dev, dtype=bf)
    b = torch.empty_like(a)
    t = bench(lambda: b.copy_(a))
    copy_gbs = 2 * n / (t * 1e-3) / 1e9
    del a, b
    m = 8192
    x = torch.randn(m, m, device=dev, dtype=bf)
    y = torch.randn(m, m, device=dev, dtype=bf)
    t = bench(lambda: x @ y)
    gemm_tflops = 2 * m**3 / (t * 1e-3) / 1e12
    return copy_gbs, gemm_tflops


def sdpa(backend, q, k, v, causal):
    def fn():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    return fn


def decode_peers(bs, L, ps, hq=32, hkv=8, d=128, flex=False):
    q = torch.randn(bs, hq, 1, d, device=dev, dtype=bf)
    k = torch.randn(bs, hkv, L, d, device=dev, dtype=bf)
    v = torch.randn(bs, hkv, L, d, device=dev, dtype=bf)
    out = {}
    out["cudnn"] = try_bench(sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, False))
    out["flash"] = try_bench(sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, False))
    if flex:
        try:
            from torch.nn.attention.flex_attention import flex_attention
            fa = torch.compile(flex_attention)
            out["flex"] = try_bench(lambda: fa(q, k, v, enable_gqa=True))
        except Exception as e:  # noqa: BLE001
            print("  flex failed:", e)
            out["flex"] = None
    # gather-then-SDPA over a paged pool with permuted pages
    pages = (L + ps - 1) // ps
    num = bs * pages + 1
    pool_k = torch.randn(num, ps, hkv, d, device=dev, dtype=bf)
    pool_v = torch.randn(num, ps, hkv, d, device=dev, dtype=bf)
    idx = (torch.randperm(num - 1, device=dev) + 1)[: bs * pages].view(bs, pages)
    del k, v

    def gather():
        kk = pool_k[idx].view(bs, pages * ps, hkv, d)[:, :L].transpose(1, 2)
        vv = pool_v[idx].view(bs, pages * ps, hkv, d)[:, :L].transpose(1, 2)
        return F.scaled_dot_product_attention(q, kk, vv, enable_gqa=True)
    out["gather_sdpa"] = try_bench(gather)
    return out


def prefill_peers(bs, s, hq=32, hkv=8, d=128, flex=False, dv=None):
    dv = dv or d
    q = torch.randn(bs, hq, s, d, device=dev, dtype=bf)
    k = torch.randn(bs, hkv, s, d, device=dev, dtype=bf)
    v = torch.randn(bs, hkv, s, dv, device=dev, dtype=bf)
    out = {}
    out["cudnn"] = try_bench(sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, True))
    out["flash"] = try_bench(sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, True))
    if dv != d:  # flash needs equal head dims; the memory-efficient kernel does not
        out["efficient"] = try_bench(sdpa(SDPBackend.EFFICIENT_ATTENTION, q, k, v, True))
    if flex:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, s, s, device=dev)
            fa = torch.compile(flex_attention)
            out["flex"] = try_bench(lambda: fa(q, k, v, block_mask=bm, enable_gqa=True))
        except Exception as e:  # noqa: BLE001
            print("  flex failed:", e)
            out["flex"] = None
    return out


def fmt(x, spec=".3f"):
    return "n/a" if x is None else format(x, spec)


def flashinfer_mla(bs, L, hq, ps, kv_dtype, backend, ws):
    """Median ms of FlashInfer's paged MLA decode (one query row per request) on a shape."""
    import flashinfer  # noqa: PLC0415 - optional peer
    pages = (L + ps - 1) // ps
    num = bs * pages + 1
    g = torch.Generator(device="cpu").manual_seed(7)
    ids = (torch.randperm(num - 1, generator=g) + 1).to(torch.int32).to(dev)
    kv_indptr = torch.arange(0, bs + 1, dtype=torch.int32, device=dev) * pages
    qo_indptr = torch.arange(0, bs + 1, dtype=torch.int32, device=dev)
    kv_len = torch.full((bs,), L, dtype=torch.int32, device=dev)
    q_nope = torch.randn(bs, hq, 512, device=dev, dtype=bf)
    q_pe = torch.randn(bs, hq, 64, device=dev, dtype=bf)
    kvt = torch.float8_e4m3fn if kv_dtype.startswith("fp8") else bf
    ckv = torch.randn(num, ps, 512, device=dev, dtype=bf).to(kvt)
    kpe = torch.randn(num, ps, 64, device=dev, dtype=bf).to(kvt)
    w = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws, backend=backend)
    w.plan(qo_indptr, kv_indptr, ids, kv_len, hq, 512, 64, ps, False, 1.0 / 576 ** 0.5, bf, kvt)
    return bench(lambda: w.run(q_nope, q_pe, ckv, kpe))


def mla_main(src, dst, gpu_file):
    """MLA decode: ours under each variant (kernel A/Bs) vs FlashInfer on the same shapes."""
    shapes = {}
    for line in open(src):
        if not line.strip().startswith("{"):
            continue
        r = json.loads(line)
        key = (r["batch"], r["q_heads"], r["kv_len"], r["page_size"], r["kv_dtype"])
        shapes.setdefault(key, []).append(r)
    gpu = open(gpu_file).read().strip() if gpu_file else torch.cuda.get_device_name()
    ws = torch.empty(512 << 20, dtype=torch.uint8, device=dev)
    try:
        import flashinfer  # noqa: F401, PLC0415
        have_fi = True
    except Exception as e:  # noqa: BLE001
        print("flashinfer not importable:", e)
        have_fi = False
    backends = [b for b in os.environ.get("FI_MLA_BACKENDS", "fa3").split(",") if b]
    rows = ["| B | h_q | L | page | latent | variant | kernel | ours ms | GB/s | % copy | TFLOP/s | "
            + " | ".join(f"FlashInfer {b} ms (ratio)" for b in backends) + " |",
            "|" + "---|" * (11 + len(backends))]
    checks = []
    for key, runs in shapes.items():
        bs, hq, L, ps, kvd = key
        fi = {}
        for backend in backends:
            fi[backend] = None
            if have_fi:
                try:
                    fi[backend] = flashinfer_mla(bs, L, hq, ps, kvd, backend, ws)
                except Exception as e:  # noqa: BLE001 - a refusal is reported, not fatal
                    print(f"  flashinfer {backend} {key} failed: {type(e).__name__} {str(e)[:160]}")
            print(f"{key} flashinfer {backend} {fi[backend]}", flush=True)
        for r in runs:
            ms = r["ms"]

            def cell(t, ms=ms):
                return "n/a" if t is None else f"{t:.3f} ({t / ms:.2f}×)"
            variant = r.get("variant", r.get("path"))
            rows.append(f"| {bs} | {hq} | {L} | {ps} | {kvd} | {variant} | {r.get('path')} | "
                        f"{ms:.3f} | {r['gbps']:.0f} | {r['pct_of_copy']:.0f}% | {r['tflops']:.1f} | "
                        + " | ".join(cell(fi[b]) for b in backends) + " |")
            if variant == "default" and hq == 16 and ps == 64 and kvd == "bf16":
                checks.append(f"h_q 16 B{bs} L{L} page 64: {r['pct_of_copy']:.0f}% of copy BW "
                              f"(target ≥ 80%)")
            if variant == "default" and hq == 128 and kvd == "bf16":
                checks.append(f"h_q 128 B{bs} L{L} page {ps}: {r['tflops']:.0f} TFLOP/s "
                              f"(target ≥ 500)")
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    md = [f"# pagoda MLA decode on {gpu}", "",
          f"Measured {now}; torch {torch.__version__}. Absorbed MLA (Dqk 576 = 512 + 64 rope, Dv "
          "512, one latent row per token), bf16 q/out, one query row per request, shuffled pages. "
          "Ours: `pagoda kernels --backend cuda --json` (CUDA events, median; bytes = latent rows "
          "read + q + out; FLOPs = 2·h_q·L·(576 + 512) per request; % copy = of the device copy "
          "bandwidth measured in the same run), one row per variant (scripts/h200_mla.sh "
          "VARIANTS). FlashInfer: BatchMLAPagedAttentionWrapper, separate ckv [.., 512] / kpe "
          "[.., 64] caches, triton do_bench median; ratio = peer ms / ours (> 1: pagoda faster).",
          ""]
    md += rows + ["", "## Targets", ""] + [f"- {c}" for c in checks] + [""]
    with open(dst, "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--mla":
        mla_main(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
        return
    ours = {}
    with open(sys.argv[1]) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                ours[r["case"]] = r
    gpu = open(sys.argv[3]).read().strip() if len(sys.argv) > 3 else torch.cuda.get_device_name()
    copy_gbs, gemm = ceilings()
    print(f"copy {copy_gbs:.0f} GB/s, gemm {gemm:.0f} TFLOP/s")
    flex = os.environ.get("PAGODA_FLEX", "1") == "1"
    peers = {
        "decode_p16_b64_l4096": decode_peers(64, 4096, 16, flex=flex),
        "decode_p16_b8_l32768": decode_peers(8, 32768, 16),
        "prefill_causal_b4_s4096": prefill_peers(4, 4096, flex=flex),
        "prefill_causal_b1_s16384": prefill_peers(1, 16384),
        "prefill_causal_b16_s1024": prefill_peers(16, 1024),
        "prefill_causal_b1_s4096": prefill_peers(1, 4096),
        "prefill_causal_b4_s4096_d64": prefill_peers(4, 4096, d=64),
        "prefill_causal_b4_s4096_d256": prefill_peers(4, 4096, d=256),
        "mla_prefill_b4_s4096_h16": prefill_peers(4, 4096, hq=16, hkv=16, d=192, dv=128),
        "mla_prefill_b1_s8192_h16": prefill_peers(1, 8192, hq=16, hkv=16, d=192, dv=128),
    }
    peers["prefill_causal_b4_s4096_p1"] = peers["prefill_causal_b4_s4096"]
    rows = []
    hdr = ("| case | path | ours ms | GB/s | % copy BW | TFLOP/s | % GEMM | cuDNN ms (ratio) | "
           "flash ms (ratio) | mem-efficient ms (ratio) | flex ms (ratio) | gather+SDPA ms (ratio) |")
    rows.append(hdr)
    rows.append("|" + "---|" * 12)
    for name, r in ours.items():
        ms = r["ms"]
        gbs = r["bytes"] / (ms * 1e-3) / 1e9
        tf = r["flops"] / (ms * 1e-3) / 1e12
        p = peers.get(name, {})

        def cell(key):
            t = p.get(key)
            return "–" if key not in p else ("n/a" if t is None else f"{t:.3f} ({t / ms:.2f}×)")
        rows.append(f"| {name} | {r['path']} | {ms:.3f} | {gbs:.0f} | {100 * gbs / copy_gbs:.0f}% | "
                    f"{tf:.1f} | {100 * tf / gemm:.0f}% | {cell('cudnn')} | {cell('flash')} | {cell('efficient')} | "
                    f"{cell('flex')} | {cell('gather_sdpa')} |")

    def get(n):
        return ours.get(n, {}).get("ms")
    checks = []

    def ratio(a, b):
        return None if a is None or b is None else a / b
    d16 = get("decode_p16_b64_l4096")
    pk = peers["decode_p16_b64_l4096"]
    r = ratio(pk.get("cudnn"), d16)
    checks.append(f"decode p16 B64 L4096 vs cuDNN: {fmt(r, '.2f')}× (target ≥ 0.90×)")
    bw = ours["decode_p16_b64_l4096"]["bytes"] / (d16 * 1e-3) / 1e9 if d16 else None
    checks.append(f"decode p16 B64 L4096 bandwidth: {fmt(bw and 100 * bw / copy_gbs, '.0f')}% of copy (target ≥ 80%)")
    r = ratio(peers["decode_p16_b8_l32768"].get("cudnn"), get("decode_p16_b8_l32768"))
    checks.append(f"decode p16 B8 L32768 vs cuDNN: {fmt(r, '.2f')}× (target ≥ 0.90×)")
    r = ratio(get("decode_p1_b64_l4096"), d16)
    checks.append(f"page 1 / page 16 time: {fmt(r, '.2f')} (target ≤ 1.10)")
    r = ratio(d16, get("decode_fp8_p16_b64_l4096"))
    checks.append(f"fp8 e4m3 speed-up over our bf16 decode: {fmt(r, '.2f')}× (target ≥ 1.6×)")
    pf = get("prefill_causal_b4_s4096")
    pp = peers["prefill_causal_b4_s4096"]
    checks.append(f"prefill causal B4 S4096 vs flash: {fmt(ratio(pp.get('flash'), pf), '.2f')}× (target ≥ 1.15×); "
                  f"vs cuDNN: {fmt(ratio(pp.get('cudnn'), pf), '.2f')}×")
    ex = ours.get("extend_q512_prefix8192_p16")
    pr = ours.get("prefill_causal_b4_s4096")
    if ex and pr:
        rate = (ex["flops"] / ex["ms"]) / (pr["flops"] / pr["ms"])
        checks.append(f"extend Q512 prefix 8192 rate / contiguous prefill rate: {rate:.2f} (target ≥ 0.85)")
    tv = ours.get("tree_verify_d64_prefix4096_b16")
    if tv:
        bwt = tv["bytes"] / (tv["ms"] * 1e-3) / 1e9
        checks.append(f"tree verify 64 tokens prefix 4096 B16: {100 * bwt / copy_gbs:.0f}% of copy BW (target ≥ 70%)")
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    md = [f"# pagoda CUDA backend on {gpu}", "",
          f"Measured {now}; torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}. "
          f"Ceilings measured in the same run: device copy {copy_gbs:.0f} GB/s (read + write), "
          f"bf16 GEMM 8192³ {gemm:.0f} TFLOP/s.", "",
          "bf16 q/out, 32 q heads / 8 kv heads, D = 128 (mla_*: 16 / 16 heads, Q/K 192, V 128). Decode bytes = Q + K + V + O; FLOPs = "
          "2·visible pairs·H·(Dqk + Dv). Peer columns: peer time (peer / ours, > 1 = pagoda faster); peers "
          "use contiguous KV except gather+SDPA (paged, page 16, permuted pages). Medians.", ""]
    md += rows + ["", "## Targets", ""] + [f"- {c}" for c in checks] + [""]
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
