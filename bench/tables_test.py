#!/usr/bin/env python3
"""bench/device/record.py and bench/tables.py on a synthetic run folder (ctest label unit).

Writes what bench/device/run.sh leaves behind (gpu.csv, ctest's JUnit file, ours_r<k>.jsonl /
peers_r<k>.jsonl with random samples, ceilings, spec / tp outputs), folds it into a record, renders
the tables and checks them against numbers computed here from the raw samples: per-round medians,
ratios peer / ours, their median and range, the verdict rule, % of ceiling, test counts, tp
agreement, and the decode step profile (synthetic ncu logs in the details and raw CSV pages:
per kernel group time, share of the step, bytes, GB/s, % of the copy ceiling, the gap between
the step and its kernels), and issue 49's hybrid tables (KV bytes per request from pages and pool
bytes, the requests that fit, the step less the attention kernels, the scan's % of copy, turn 2's
TTFT ratio). The seed (from the clock) is printed first."""
import json
import statistics
import os
import random
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "cuda"))
from cases import jit_groups, kind, load_cases  # noqa: E402 - bench/cuda/cases.py
RECORD = os.path.join(HERE, "device", "record.py")
TABLES = os.path.join(HERE, "tables.py")


def med(xs):
    """Median as pagoda_cuda_bench / peers.py report it (upper middle of the sorted samples)."""
    s = sorted(xs)
    return s[len(s) // 2]


def median_of(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def make_run(d, rng, rounds, cases, peers):
    """A synthetic run folder; returns {case: {"ours": [ms], peer: [ms or None]}} per round."""
    truth = {c: {"ours": [], **{p: [] for p in peers}} for c in cases}
    base = {c: rng.uniform(0.05, 3.0) for c in cases}
    # Peers clearly slower (1.6x), clearly faster (0.6x) or level with ours: every verdict.
    factor = {(c, p): (0.6, 1.0, 1.6)[(i + j) % 3] for i, c in enumerate(cases)
              for j, p in enumerate(peers)}
    with open(os.path.join(d, "gpu.csv"), "w") as f:
        f.write("0, NVIDIA H200, 580.159.04, 143771 MiB, 1980 MHz, 1980 MHz, 3201 MHz, 3201 MHz, 700.00 W\n")
    with open(os.path.join(d, "torch.txt"), "w") as f:
        f.write("2.11.0+cu130 91900\n")
    write_jsonl(os.path.join(d, "ceilings.jsonl"),
                [{"ceiling": "copy_gbps", "value": 4200.0}, {"ceiling": "gemm_tflops", "value": 700.0}])
    for k in range(1, rounds + 1):
        ours, prs = [], []
        for c in cases:
            s = [base[c] * rng.uniform(0.95, 1.1) for _ in range(30)]
            ours.append({"case": c, "ms": med(s), "samples_ms": s, "bytes": 1.07e9,
                         "flops": 5.5e11, "path": "sm90"})
            truth[c]["ours"].append(med(s))
            for p in peers:
                if p == "flashinfer_fa2" and c.startswith("mla"):
                    prs.append({"case": c, "peer": p, "error": "ValueError: refused"})
                    truth[c][p].append(None)
                    continue
                if p == "cudnn" and c.startswith("decode"):
                    prs.append({"case": c, "peer": p, "skipped": "SDPA takes no fp8 K/V"})
                    truth[c][p].append("skipped")
                    continue
                ps = [base[c] * factor[(c, p)] * rng.uniform(0.9, 1.15) for _ in range(30)]
                prs.append({"case": c, "peer": p, "ms": med(ps), "samples_ms": ps})
                truth[c][p].append(med(ps))
        # Round files as run.sh names them; extra non-JSON lines must be skipped.
        write_jsonl(os.path.join(d, f"ours_r{k}.jsonl"), ours)
        write_jsonl(os.path.join(d, f"peers_r{k}.jsonl"), prs)
        with open(os.path.join(d, f"peers_r{k}.jsonl"), "a") as f:
            f.write("flashinfer: compiling kernel ...\n")
    return truth


# Synthetic kernels of a decode forward: (name as ncu prints it, the short name the tables show,
# grid); a layer is LAYER, a forward LAYER * layers + TAIL; the sampler's kernel ends it.
NORM = ("void pagoda::model::cuda::(anonymous namespace)::add_rms_norm_kernel<__nv_bfloat16, 8>"
        "(__nv_bfloat16 *, const __nv_bfloat16 *, int)", "add_rms_norm_kernel<bf16,8>", "(1, 1, 1)")
GEMM = "void pagoda::model::cuda::small_m_gemm_kernel<__nv_bfloat16, 1, 4>(const __nv_bfloat16 *, int)"
LAYER = [NORM, (GEMM, "small_m_gemm_kernel<bf16,1,4>", "(96, 1, 1)"),
         ("void pagoda::kernels::cuda::decode_tc_kernel<64, 16>(pagoda::kernels::cuda::DecodeParams)",
          "decode_tc_kernel<64,16>", "(8, 4, 1)"),
         (GEMM, "small_m_gemm_kernel<bf16,1,4>", "(64, 1, 1)"), NORM]
TAIL = [("void pagoda::model::cuda::(anonymous namespace)::argmax_split_kernel(const float *, long, int)",
         "argmax_split_kernel", "(16, 1, 1)"),
        ("void pagoda::model::cuda::(anonymous namespace)::sample_kernel(const float *, long, int)",
         "sample_kernel", "(1, 1, 1)")]
PREFILL = ("void pagoda::kernels::cuda::prefill_sm90_kernel<128>(pagoda::kernels::cuda::Params)",
           "prefill_sm90_kernel<128>", "(132, 1, 1)")
HEAD = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
        "Block Size", "Grid Size", "Device", "CC"]
PROF_METRICS = ["dram__bytes_read.sum", "dram__bytes_write.sum",
                "dram__throughput.avg.pct_of_peak_sustained_elapsed", "gpu__time_duration.sum"]


def q(cells):
    return ",".join('"' + str(c) + '"' for c in cells) + "\n"


def make_profile(d, rng, tag, steps, layers, raw, extra_last=False):
    """A profiled run: a forward cut by the launch window, a prefill forward, steps + 2 decode
    forwards (the last with one extra kernel when extra_last), as ncu prints it (the details page,
    or with raw the raw page in other units). Returns {"groups": {key: {"launches", "ns", "bytes",
    "pct_ns"} per summarised step}, "step_ns": [...], "step_ms", "forwards"}."""
    layer = LAYER * layers + TAIL
    fwds = [(layer[3:])]  # the first forward, cut by --launch-skip
    fwds.append([PREFILL if k[1].startswith("decode") else k for k in layer])
    fwds += [list(layer) for _ in range(steps + 2)]
    if extra_last:
        fwds[-1] = fwds[-1][:-2] + [NORM] + fwds[-1][-2:]
    lines = ["==PROF== Connected to process 4242 (/tmp/b-device/pagoda)\n"]
    lines.append(q(HEAD + (PROF_METRICS if raw else ["Section Name", "Metric Name", "Metric Unit",
                                                      "Metric Value"])))
    if raw:
        lines.append(q([""] * len(HEAD) + ["Kbyte", "Mbyte", "%", "usecond"]))
    truth = {"groups": {}, "step_ns": [], "forwards": len(fwds)}
    kid = 0
    for f, fw in enumerate(fwds):
        s = f - (len(fwds) - steps)  # index among the summarised steps, < 0 before them
        if s >= 0:
            truth["step_ns"].append(0.0)
        for name, short, grid in fw:
            rd_kb, wr_mb = rng.randrange(1, 40000), round(rng.uniform(0.001, 5), 3)
            us, pct = round(rng.uniform(1.5, 40), 4), round(rng.uniform(1, 95), 2)
            rd, wr, ns = rd_kb * 1e3, wr_mb * 1e6, us * 1e3
            base = [kid, 4242, "pagoda", "127.0.0.1", name, 1, 7, "(256, 1, 1)", grid, 0, "9.0"]
            if raw:
                lines.append(q(base + [f"{rd_kb:,}", f"{wr_mb:.3f}", f"{pct:.2f}", f"{us:.4f}"]))
            else:
                sec = "Command line profiler metrics"
                lines += [q(base + [sec, PROF_METRICS[0], "byte", f"{int(rd):,}"]),
                          q(base + [sec, PROF_METRICS[1], "byte", f"{int(round(wr)):,}"]),
                          q(base + [sec, PROF_METRICS[2], "%", f"{pct:.2f}"]),
                          q(base + [sec, PROF_METRICS[3], "nsecond", f"{ns:,.1f}"])]
                wr, ns = round(wr), float(f"{ns:.1f}")
            lines.append(f"==PROF== Profiling \"{short}\" - {kid}: 0%....50%....100% - 1 pass\n")
            kid += 1
            if s < 0:
                continue
            g = truth["groups"].setdefault(f"{short} {grid.replace(' ', '')}", {
                "launches": [0] * steps, "ns": [0.0] * steps, "bytes": [0.0] * steps, "pct_ns": 0.0})
            g["launches"][s] += 1
            g["ns"][s] += ns
            g["bytes"][s] += rd + wr
            g["pct_ns"] += pct * ns
            truth["step_ns"][s] += ns
        if f == 1:  # the application's own output comes between ncu's lines
            lines.append('{"note": "pagoda bench progress"}\n')
    pdir = os.path.join(d, "profile")
    os.makedirs(pdir, exist_ok=True)
    with open(os.path.join(pdir, f"{tag}.ncu.csv"), "w") as f:
        f.writelines(lines)
    with open(os.path.join(pdir, f"{tag}.ncu.err"), "w") as f:
        f.write("==PROF== Profiling \"x\" - 0: 0%....50%....100% - 2 passes\n" if raw else "")
    truth["step_ms"] = rng.uniform(1.2, 1.6) * sum(truth["step_ns"]) / steps / 1e6
    with open(os.path.join(pdir, f"{tag}.bench.json"), "w") as f:
        json.dump({"decode_step_ms": truth["step_ms"], "cuda_graphs": 1, "decode_steps": 127}, f)
    with open(os.path.join(pdir, f"{tag}.meta.json"), "w") as f:
        json.dump({"layout": tag.split("_")[0], "batch": int(tag.split("_b")[1]), "steps": steps,
                   "launch_skip": 336, "input_len": 192, "output_len": steps + 3,
                   "timed_input_len": 128, "timed_output_len": 128, "ncu_rc": 0}, f)
    return truth


def check_profile(md, rec, tag, truth, steps, copy_gbps, uniform, passes):
    r = rec["profile"]["runs"][tag]
    expect(r.get("steps") == steps and r["forwards_seen"] == truth["forwards"], f"{tag} steps {r}")
    expect(r["uniform"] == uniform and r["ncu_passes"] == passes, f"{tag} uniform / passes")
    step_us = truth["step_ms"] * 1e3
    ks = [x / 1e3 for x in truth["step_ns"]]
    kern = sum(ks) / steps
    want = (f"{kern:.1f} µs [{min(ks):.1f}–{max(ks):.1f}] = {100 * kern / step_us:.1f} % of the step; "
            f"the rest, {step_us - kern:.1f} µs ({100 * (step_us - kern) / step_us:.1f} %)")
    expect(want in md, f"{tag} step line: {want}")
    nbytes = sum(sum(g["bytes"]) for g in truth["groups"].values()) / steps
    expect(f"DRAM per step {nbytes / 1e6:.1f} MB, {nbytes / (kern * 1e3):.0f} GB/s" in md, f"{tag} DRAM")
    section = md[md.index(f"### Decode step profile: {tag.split('_')[0]} layout, batch {tag.split('_b')[1]} "):]
    for key, g in truth["groups"].items():
        us = [x / 1e3 for x in g["ns"]]
        mean = sum(us) / steps
        gbps = sum(g["bytes"]) / sum(g["ns"])
        row = (f"| `{key}` | {sum(g['launches']) / steps:g} | {mean:.1f} [{min(us):.1f}–{max(us):.1f}] | "
               f"{100 * mean / step_us:.1f} % | {sum(g['bytes']) / steps / 1e6:.2f} | {gbps:.0f} | "
               f"{100 * gbps / copy_gbps:.0f}% | {g['pct_ns'] / sum(g['ns']):.0f}% |")
        expect(row in section[4:].split("### ")[0], f"{tag} row {row}")


def make_hybrid(d, rng):
    """A synthetic hybrid run folder (run.sh's hybrid group); returns the numbers the tables
    must show, computed here from the raw fields."""
    h = os.path.join(d, "hybrid")
    os.makedirs(h)
    files = {"meta": {"backend": "cuda", "dtype": "bf16", "gemma_layout": "gemma3-1b",
                      "bamba_layout": "bamba-1b", "swa_ctx": 32768, "swa_requests": 12,
                      "swa_budget_bytes": 2 * 2**30, "mamba_short": 8192, "mamba_long": 65536,
                      "prefix": 8192, "attention_layers": 2}}
    full_pages = 2049
    page_b = {"off": 26 * 16384, "on": 4 * 16384}
    swa_b = 22 * 16384
    pages = {"off": rng.randrange(2100, 2200), "on": rng.randrange(2100, 2200)}
    swa_pages, swa_peak = rng.randrange(300, 600), rng.randrange(33, 66)
    step = {"off": rng.uniform(2, 4), "on": rng.uniform(1, 2)}
    for k in ("off", "on"):
        j = {"page_size": 16, "peak_kv_tokens": full_pages * 16, "pages_total": pages[k],
             "kv_bytes": page_b[k] * (pages[k] + 1), "decode_step_ms": step[k],
             "swa_pool_pages": swa_pages if k == "on" else 0,
             "swa_kv_bytes": swa_b * (swa_pages + 1) if k == "on" else 0,
             "swa_peak_pages_per_request": swa_peak if k == "on" else 0}
        files[f"swa_step_{k}"] = j
    fit = {"off": 2, "on": rng.randrange(5, 12)}
    for k in ("off", "on"):
        files[f"swa_fit_{k}"] = {"page_size": 16, "pool_tokens": 70000 if k == "off" else 350000,
                                 "swa_pool_pages": 0 if k == "off" else 2000,
                                 "decode_batch_max": fit[k], "failed_requests": 0,
                                 "peak_kv_tokens": fit[k] * 32768 + 100}
    mstep = {8192: rng.uniform(3, 4), 65536: rng.uniform(3, 5)}
    attn = {8192: rng.uniform(0.01, 0.02), 65536: rng.uniform(0.05, 0.1)}
    for c in (8192, 65536):
        files[f"mamba_step_{c}"] = {"decode_step_ms": mstep[c]}
        files[f"attn_decode_{c}"] = {"ms": attn[c]}
    scan = {"op": "linear-decode", "backend": "cuda", "batch": 64, "tokens": 1, "ms": 0.2,
            "ms_min": 0.19, "tokens_per_s": 3.2e5, "gbps": rng.uniform(1000, 3000),
            "copy_gbps": 3000.0, "tflops": 0.5, "gemm_tflops": 700.0, "copy_kind": "cuda_d2d_memcpy",
            "gemm_kind": "cublas_bf16"}
    scan["pct_of_copy"] = 100 * scan["gbps"] / scan["copy_gbps"]
    scan["pct_of_gemm"] = 100 * scan["tflops"] / scan["gemm_tflops"]
    files["scan_decode"] = scan
    ttft = {"cached": [rng.uniform(100, 200), rng.uniform(5, 20)],
            "cold": [rng.uniform(100, 200), rng.uniform(100, 200)]}
    for k in ("cached", "cold"):
        files[f"ttft_{k}"] = {"ttft_by_turn_ms": ttft[k], "prefix_hit_rate": 0.5 if k == "cached" else 0.0,
                              "output_digest": "abcd"}
    for name, j in files.items():
        with open(os.path.join(h, name + ".json"), "w") as f:
            f.write("pagoda: loading ...\n" + json.dumps(j) + "\n")
    with open(os.path.join(h, "swa_step_on.err"), "w") as f:
        f.write("progress\n")
    kvb = {"off": full_pages * page_b["off"], "on": full_pages * page_b["on"] + swa_peak * swa_b}
    rest = {c: mstep[c] - 2 * attn[c] for c in (8192, 65536)}
    return {"kv_ratio": kvb["on"] / kvb["off"], "kv_on_mib": kvb["on"] / 2**20,
            "step_ratio": step["on"] / step["off"], "fit": fit, "swa_peak": swa_peak,
            "step_long_over_short": mstep[65536] / mstep[8192],
            "rest_ratio": rest[65536] / rest[8192], "scan_pct": scan["pct_of_copy"],
            "ttft_ratio": ttft["cached"][1] / ttft["cold"][1]}


def check_hybrid(md, t):
    sec = md[md.index("### Hybrid models (issue 49)"):]
    row = next(ln for ln in sec.splitlines() if ln.startswith("| window layers in the SWA pool |"))
    want = f"| 2049 | {t['swa_peak']} | {t['kv_on_mib']:.1f} MiB | {t['kv_ratio']:.3f}× |"
    expect(want in row, f"hybrid KV row {row!r} lacks {want!r}")
    expect(row.endswith(f"| {t['step_ratio']:.3f}× |"), f"hybrid step ratio {row!r}")
    row = next(ln for ln in sec.splitlines() if ln.startswith("| SWA pool |"))
    expect(f"| {t['fit']['on'] + 100 / 32768:.2f} | {t['fit']['on']} | {t['fit']['on'] / t['fit']['off']:.1f}× | 0 |"
           in row, f"fit row {row!r}")
    expect(f"step {t['step_long_over_short']:.3f}×, step − attention {t['rest_ratio']:.3f}×" in sec,
           "hybrid 64k / 8k line")
    expect(f"| {t['scan_pct']:.1f} % |" in sec, "scan % of copy")
    expect(f"Turn 2 cached / cold: {t['ttft_ratio']:.3f}×" in sec, "ttft ratio")
    expect("commit `abc1234`" in sec.splitlines()[0], "hybrid header names the commit")


def run_record(d, out, stages):
    subprocess.run([sys.executable, RECORD, d, "--kind", "h200", "--group", "kernels",
                    "--commit", "abc1234", "--stages", stages, "--out", out], check=True,
                   capture_output=True)
    return json.load(open(out))


def tables(*records):
    return subprocess.run([sys.executable, TABLES, *records], check=True, capture_output=True,
                          text=True).stdout


def expect(cond, what):
    if not cond:
        print("FAIL:", what)
        sys.exit(1)


def check_cases():
    """bench/cuda/cases.json: every field pagoda_cuda_bench reads (json.at) is present after the
    defaults, names are unique, the name prefixes agree with the kind the peers derive, and the
    FlashInfer module groups cover every case once."""
    cases = load_cases(os.path.join(HERE, "cuda", "cases.json"))
    fields = {"name", "batch", "qo", "prefix", "page", "kv", "tree", "hq", "hkv", "d", "dv", "latent"}
    for c in cases:
        expect(fields <= set(c), f"{c.get('name')}: missing {fields - set(c)}")
        expect(c["kv"] in ("bf16", "fp8_e4m3"), f"{c['name']}: kv {c['kv']}")
    names = [c["name"] for c in cases]
    expect(len(set(names)) == len(names), "unique case names")
    for c in cases:
        k = kind(c)
        want = {"decode": ("decode",), "mla_decode": ("mla_decode",), "tree": ("tree",),
                "prefill": ("prefill", "mla_prefill", "fp8kv_causal"),
                "extend": ("extend", "mla_extend", "fp8kv_ext")}[k]
        expect(c["name"].startswith(want), f"{c['name']} classified as {k}")
    grouped = [n for g in jit_groups(cases) for n in g]
    expect(sorted(grouped) == sorted(names), "JIT groups cover every case once")


def main():
    check_cases()
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else int(time.time()) % 100000  # argv: rerun one
    print(f"seed {seed}")
    rng = random.Random(seed)
    cases = ["decode_p16_b64_l4096", "prefill_causal_b4_s4096", "mla_prefill_b4_s4096_h16"]
    peers = ["cudnn", "flashinfer_fa2", "flashinfer_fa3"]
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "run")
        os.mkdir(d)
        rounds = 5
        truth = make_run(d, rng, rounds, cases, peers)
        with open(os.path.join(d, "ctest_gpu.xml"), "w") as f:
            f.write('<?xml version="1.0"?><testsuite tests="3">'
                    '<testcase name="cuda_attention_tests" time="12.5" status="run"/>'
                    '<testcase name="cuda_backend_tests" time="3.0" status="run"/>'
                    '<testcase name="conformance_cuda" time="40.0" status="fail">'
                    '<failure message="Failed"/></testcase></testsuite>')
        os.makedirs(os.path.join(d, "tp"))
        same = rng.randrange(0, 21)
        a = [[rng.randrange(1000) for _ in range(24)] for _ in range(20)]
        b = [x if i < same else [x[0] + 1] + x[1:] for i, x in enumerate(a)]
        write_jsonl(os.path.join(d, "tp", "gen_f32_tp1.jsonl"), [{"output_token_ids": x} for x in a])
        write_jsonl(os.path.join(d, "tp", "gen_f32_tp2.jsonl"), [{"output_token_ids": x} for x in b])
        step = {1: rng.uniform(5, 10), 2: rng.uniform(3, 6)}
        for tp in (1, 2):
            with open(os.path.join(d, "tp", f"bench_8b_b64_tp{tp}.json"), "w") as f:
                f.write("tensor parallel: 2 ranks\n" + json.dumps({"decode_step_ms": step[tp]}) + "\n")
        os.makedirs(os.path.join(d, "python"))
        pa = [rng.uniform(0.3, 0.4) for _ in range(7)]
        pb = [rng.uniform(0.3, 0.4) for _ in range(7)]
        write_jsonl(os.path.join(d, "python", "vs_flashinfer.jsonl"),
                    [{"case": "decode_x", "ok": True, "o_err": 1e-3, "lse_err": 2e-4, "pagoda_ms": pa,
                      "flashinfer_ms": pb, "pagoda_plan_ms": 0.1, "flashinfer_plan_ms": 0.4}])
        with open(os.path.join(d, "python", "llm_vs_bench.json"), "w") as f:
            json.dump({"backend": "cuda", "requests": 64, "input_len": 128, "output_len": 128,
                       "median": {"llm": 980.0, "bench": 1000.0}, "ratio": 0.98}, f)
        os.makedirs(os.path.join(d, "hicache"))
        with open(os.path.join(d, "hicache", "pinned_copy.json"), "w") as f:
            json.dump({"h2d_pinned_gbps": 52.25, "samples_ms": [20.5] * 10}, f)
        hit = {"device": rng.uniform(0.1, 0.3), "host": rng.uniform(0.6, 0.9)}
        for run in ("device", "host"):
            j = {"prefix_hit_rate": hit[run], "output_tokens_per_s": 1000.0, "ttft_p50_ms": 10.0,
                 "ttft_p99_ms": 40.0, "live_kv_over_pool": 4.2, "leaked_pages": 0,
                 "cached_tokens": 100, "output_digest": "00ff"}
            if run == "host":
                j["hicache"] = {"device_hit_tokens": 100, "host_hit_tokens": 300, "bytes_h2d": 5e6,
                                "load_stalls": 2, "load_stall_s": 0.004, "leaked_host_pages": 0}
            with open(os.path.join(d, "hicache", f"1b_{run}.json"), "w") as f:
                f.write("pagoda bench: ...\n" + json.dumps(j) + "\n")
        lb_ms = {c: sorted(rng.uniform(lo, lo * 1.2) for _ in range(5))
                 for c, lo in (("cold", 60.0), ("device", 9.0), ("host", 10.0))}
        with open(os.path.join(d, "hicache", "loadback_1b_e512.json"), "w") as f:
            json.dump({"workload": "loadback", "prefix_tokens": 8192, "extend_tokens": 512,
                       "load_bytes": 268435456,
                       "ttft_ms": {c: {"median": v[2], "min": v[0], "max": v[4], "samples": v}
                                   for c, v in lb_ms.items()},
                       "host_over_device": lb_ms["host"][2] / lb_ms["device"][2],
                       "cold_over_host": lb_ms["cold"][2] / lb_ms["host"][2],
                       "load_gbps_lower_bound": 268435456 / (lb_ms["host"][2] * 1e6)}, f)
        steps = 4
        prof = {"1b_b1": make_profile(d, rng, "1b_b1", steps, 3, raw=False),
                "1b_b64": make_profile(d, rng, "1b_b64", steps, 2, raw=True, extra_last=True)}
        # The batch-1 option A/B (run.sh's PROFILE_AB): two alternating rounds each; ratios are
        # taken per round (base round k over variant round k).
        ab_ms = {"base": [1.0, 1.1], "min_chunk512": [0.9, 1.0], "min_chunk256": [1.2, 0.95]}
        for name, vals in ab_ms.items():
            for k, v in enumerate(vals, 1):
                with open(os.path.join(d, "profile", f"1b_b1.ab_{k}_{name}.json"), "w") as f:
                    json.dump({"decode_step_ms": v}, f)
        # A run whose log has too few forwards: its table says so, the others are unaffected.
        make_profile(d, rng, "8b_b1", steps, 2, raw=False)
        with open(os.path.join(d, "profile", "8b_b1.ncu.csv")) as f:
            cut = f.readlines()
        with open(os.path.join(d, "profile", "8b_b1.ncu.csv"), "w") as f:
            f.writelines(cut[:len(cut) // 3])
        os.makedirs(os.path.join(d, "agree"))
        agree = rng.randrange(15, 21)
        with open(os.path.join(d, "agree", "result.json"), "w") as f:
            f.write(json.dumps({"commit": "abc1234", "device": "cuda", "rows": [
                {"layout": "deepseek-v3-tiny", "length": 300, "prompts": 20,
                 "first_token_agree": agree, "max_abs_logit_diff": 0.0123,
                 "max_abs_logit": 4.5}]}) + "\n")
        hyb = make_hybrid(d, rng)
        rec = run_record(d, os.path.join(tmp, "rec.json"),
                         "build tests kernels tp python hicache profile hybrid")
        expect(sorted(rec["hybrid"]) == sorted(["meta", "swa_step_off", "swa_step_on", "swa_fit_off",
                                                "swa_fit_on", "mamba_step_8192", "mamba_step_65536",
                                                "attn_decode_8192", "attn_decode_65536",
                                                "scan_decode", "ttft_cached", "ttft_cold"]),
               f"hybrid parts {sorted(rec['hybrid'])}")

        # The record: metadata, every sample (rounded to 10 ns), tests, tp agreement.
        expect(rec["commit"] == "abc1234" and rec["gpus"][0]["name"] == "NVIDIA H200", "metadata")
        expect(rec["gpus"][0]["sm_max_mhz"] == "1980 MHz", "clocks")
        expect(len(rec["kernels"]["rounds"]) == rounds, "rounds")
        n = sum(len(r["samples_ms"]) for rnd in rec["kernels"]["rounds"] for r in rnd["ours"])
        expect(n == rounds * len(cases) * 30, f"every ours sample kept ({n})")
        r0 = rec["kernels"]["rounds"][0]["ours"][0]
        expect(all(abs(x - round(x, 5)) < 1e-12 for x in r0["samples_ms"]), "samples rounded")
        expect([t["status"] for t in rec["tests"]] == ["run", "run", "fail"], "junit statuses")
        g = rec["tp"]["generate_f32"]
        expect(g["identical"] == same and g["first_token_identical"] == same, "tp agreement")
        expect(rec["tp"]["bench"]["8b_b64_tp2"]["decode_step_ms"] == step[2], "tp bench last line")

        md = tables(os.path.join(tmp, "rec.json"))
        print(md)
        expect("commit `abc1234`" in md and "driver 580.159.04" in md, "header")
        expect(f"| deepseek-v3-tiny | 300 | {agree} / 20 | 0.0123 | 4.5 |" in md, "agreement row")
        expect("2 / 3 passed." in md, "test count")
        for c in cases:
            line = next(ln for ln in md.splitlines() if ln.startswith(f"| {c} |"))
            cells = [x.strip() for x in line.strip("|").split("|")]
            o = truth[c]["ours"]
            expect(cells[2] == f"{median_of(o):.4f} [{min(o):.4f}–{max(o):.4f}]", f"{c} ours {cells[2]}")
            if c.startswith("decode"):
                pct = 100 * 1.07e9 / (median_of(o) * 1e-3) / 1e9 / 4200.0
                expect(cells[3] == f"{pct:.0f}% copy", f"{c} % copy")
            else:
                pct = 100 * 5.5e11 / (median_of(o) * 1e-3) / 1e12 / 700.0
                expect(cells[3] == f"{pct:.0f}% GEMM", f"{c} % GEMM")
            for i, p in enumerate(peers):
                pm = truth[c][p]
                cell = cells[4 + i]
                if all(x is None for x in pm):
                    expect(cell == "refused", f"{c} {p} refused")
                    continue
                if all(x == "skipped" for x in pm):
                    expect(cell == "n/a", f"{c} {p} n/a")
                    continue
                ratios = [y / x for x, y in zip(o, pm)]
                v = ("faster" if min(ratios) > 1 else "slower" if max(ratios) < 1 else "within noise")
                want = (f"{median_of(pm):.4f}; {median_of(ratios):.3f} "
                        f"[{min(ratios):.3f}–{max(ratios):.3f}] {v}")
                expect(cell == want, f"{c} {p}: {cell!r} != {want!r}")
        for v in ("faster", "slower", "within noise"):
            expect(v in md, f"the synthetic run covers the verdict '{v}'")
        expect(f"{step[1] / step[2]:.2f}×" in md, "tp speed-up")
        expect(f"{same}/20 identical" in md, "tp identical line")

        pline = next(ln for ln in md.splitlines() if ln.startswith("| decode_x |"))
        want = f"{statistics.median(pb) / statistics.median(pa):.2f}×"
        expect(want in pline and "ok (1.0e-03, 2.0e-04)" in pline, f"python row {pline}")
        expect("LLM / bench 98.0 %" in md, "llm_vs_bench line")

        expect("52.2 GB/s" in md or "52.3 GB/s" in md, "pinned copy")
        for run in ("device", "host"):
            line = next(ln for ln in md.splitlines() if ln.startswith(f"| 1b | {run} |"))
            expect(f"{100 * hit[run]:.1f} %" in line, f"hicache hit rate {line}")
        expect("| 100 / 300 | 5.0 | 2 (0.004) |" in md, "hicache host row")
        lbl = next(ln for ln in md.splitlines() if ln.startswith("| 1b_e512 |"))
        gbps = 268435456 / (lb_ms["host"][2] * 1e6)
        expect(f"| 8192 + 512 | {lb_ms['cold'][2]:.2f} [{lb_ms['cold'][0]:.2f} – "
               f"{lb_ms['cold'][4]:.2f}] |" in lbl and
               f"{lb_ms['host'][2] / lb_ms['device'][2]:.3f}×" in lbl and
               f"| 268.4 | {gbps:.1f} ({100 * gbps / 52.25:.0f} %) |" in lbl, f"loadback row {lbl}")
        expect(not any(ln.startswith("| loadback") for ln in md.splitlines()),
               "the probe is not a multiturn row")
        check_hybrid(md, hyb)
        check_profile(md, rec, "1b_b1", prof["1b_b1"], steps, 4200.0, True, 1)
        expect(rec["profile"]["runs"]["1b_b1"]["ab"] == ab_ms, "profile A/B steps")
        expect("ab" not in rec["profile"]["runs"]["1b_b64"], "no A/B at batch 64")
        expect("Option A/B (`pagoda bench`, the same step, 2 alternating rounds): min_chunk512 "
               "0.9500 ms [0.9000–1.0000] against no option 1.0500 ms [1.0000–1.1000]: base / "
               "min_chunk512 1.106 [1.100–1.111], faster." in md, "profile A/B line (faster)")
        expect("base / min_chunk256 0.996 [0.833–1.158], within noise." in md,
               "profile A/B line (within noise)")
        check_profile(md, rec, "1b_b64", prof["1b_b64"], steps, 4200.0, False, 2)
        expect("sequences differ between steps" in md, "non-uniform steps named")
        expect(re.search(r"8b layout, batch 1 .*\n\nNo profile: ValueError: \d+ forwards", md)
               is not None, "a cut log gives an error line")

        # A CPU record (run.sh kind cpu): no gpus, the header names the CPU.
        dc = os.path.join(tmp, "cpu")
        os.mkdir(dc)
        make_hybrid(dc, rng)
        with open(os.path.join(dc, "cpu.txt"), "w") as f:
            f.write("Some Xeon CPU, 2 threads\n")
        # A refused run (run.sh's hy writes its error as the JSON): the row says so.
        with open(os.path.join(dc, "hybrid", "swa_fit_on.json"), "w") as f:
            f.write(json.dumps({"error": "pagoda: the SWA pool runs on the CPU path only", "rc": 1}) + "\n")
        run_record(dc, os.path.join(tmp, "cpu.json"), "hybrid")
        mdc = tables(os.path.join(tmp, "cpu.json"))
        expect("CPU Some Xeon CPU, 2 threads" in mdc and "### Hybrid models" in mdc, "CPU header")
        expect("| on | failed (rc 1): pagoda: the SWA pool runs on the CPU path only | | | | | |" in mdc,
               "a failed run's row")

        # Issue 51's CPU model rows (bench/cpu_model_vs_torch.py's document in the run's amx
        # folder): per threads x N, pagoda's output tok/s over transformers' on the same prompts.
        os.mkdir(os.path.join(d, "amx"))
        doc = {"date": "2026-12-06 00:00 UTC", "cpu": "Xeon",
               "args": {"model": "/tmp/llama-1b", "input_len": 128, "output_len": 32},
               "rows": []}
        for t in (2, 16):
            for n in (1, 8):
                tok, ttok = rng.uniform(5, 80), rng.uniform(2, 40)
                doc["rows"].append({
                    "threads": t, "requests": n,
                    "pagoda": {"onednn": {"output_tok_s": tok, "decode_ms": rng.uniform(50, 200),
                                          "ttft_ms": rng.uniform(300, 900), "load_s": 4.25,
                                          "cpu_gemm": "onednn"},
                               "openblas": {"refused": "--cpu-gemm openblas: no"}},
                    "torch": {"output_tok_s": ttok, "prefill_ms": 400.0, "decode_ms": 120.0,
                              "torch": "2.9"}})
        doc["rows"].append({"threads": 16, "requests": 16, "pagoda": {}, "torch": None,
                            "skipped": "the 240 s budget was spent"})
        with open(os.path.join(d, "amx", "cpu_model_vs_torch.json"), "w") as f:
            json.dump(doc, f)
        run_record(d, os.path.join(tmp, "amx.json"), "build amx")
        mdx = tables(os.path.join(tmp, "amx.json"))
        for row in doc["rows"][:4]:
            r, tr = row["pagoda"]["onednn"], row["torch"]
            want = (f"| {row['threads']} | {row['requests']} | pagoda onednn | "
                    f"{r['output_tok_s']:.1f} | {r['decode_ms']:.1f} | {r['ttft_ms']:.0f} | 4.2 | "
                    f"{r['output_tok_s'] / tr['output_tok_s']:.2f}× |")
            expect(want in mdx, f"cpu model row {want!r} missing")
            expect(f"| {row['threads']} | {row['requests']} | transformers 2.9 bf16 | "
                   f"{tr['output_tok_s']:.1f} | 120.0 | 400 | – | – |" in mdx, "transformers row")
            expect(f"| {row['threads']} | {row['requests']} | pagoda openblas | refused: "
                   "--cpu-gemm openblas: no |" in mdx, "refused row")
        expect("| 16 | 16 | skipped: the 240 s budget was spent |" in mdx, "skipped row")

        # One round: no verdict.
        d1 = os.path.join(tmp, "one")
        os.mkdir(d1)
        make_run(d1, rng, 1, cases[:1], peers[2:])
        run_record(d1, os.path.join(tmp, "one.json"), "kernels")
        md1 = tables(os.path.join(tmp, "one.json"))
        expect(re.search(r"\| decode_p16_b64_l4096 \|.*1 round \|", md1) is not None, "1 round")

        # An engine-option A/B record (bench/device/ab_options.py): per-round ratios first / variant.
        ab_rounds = 3
        step_ms = {(bs, n, r): rng.uniform(1.0, 2.0) for bs in (1, 64) for n in ("a", "b")
                   for r in range(ab_rounds)}
        ab = {"commit": "def5678", "date": "2026-12-06T00:00:00Z",
              "gpus": [{"name": "NVIDIA H100", "driver": "1"}],
              "ab": {"model": "m", "input_len": 128, "output_len": 128,
                     "variants": [{"name": "a", "options": []}, {"name": "b", "options": ["--x", "1"]}],
                     "samples": [{"round": r, "batch": bs, "variant": n,
                                  "decode_step_ms": v} for (bs, n, r), v in step_ms.items()]}}
        with open(os.path.join(tmp, "ab.json"), "w") as f:
            json.dump(ab, f)
        mdab = tables(os.path.join(tmp, "ab.json"))
        for bs in (1, 64):
            line = next(ln for ln in mdab.splitlines() if ln.startswith(f"| {bs} | b |"))
            ratios = [step_ms[(bs, "a", r)] / step_ms[(bs, "b", r)] for r in range(ab_rounds)]
            bv = [step_ms[(bs, "b", r)] for r in range(ab_rounds)]
            v = ("faster" if min(ratios) > 1 else "slower" if max(ratios) < 1 else "within noise")
            want = (f"| {bs} | b | --x 1 | {statistics.median(bv):.4f} [{min(bv):.4f}–{max(bv):.4f}] | "
                    f"{statistics.median(ratios):.3f} [{min(ratios):.3f}–{max(ratios):.3f}] | {v} |")
            expect(line == want, f"ab row {line!r} != {want!r}")

        # A kernel-option A/B run (run.sh ab_kernels): ab_<name>_r<k>.jsonl of the base and each
        # variant; per round the ratio base / variant of the round medians.
        dk = os.path.join(tmp, "kab")
        os.mkdir(dk)
        with open(os.path.join(dk, "gpu.csv"), "w") as f:
            f.write("0, NVIDIA H100 80GB HBM3, 580.1, 81559 MiB, 1980 MHz, 1980 MHz, 2619 MHz, 2619 MHz, 700.00 W\n")
        with open(os.path.join(dk, "ab_variants.txt"), "w") as f:
            f.write("fp8|fp8kv_|--kernel-option sm90_fp8=1\nk64|mla_|--kernel-option sm90_mla_k64=1\n")
        kcases = {"fp8": ["fp8kv_a", "fp8kv_b"], "k64": ["mla_a"]}
        kab_rounds = 4
        kms = {}
        for k in range(1, kab_rounds + 1):
            rows = {"base": []}
            for name, cs in kcases.items():
                rows[name] = []
                for c in cs:
                    for side in ("base", name):
                        samples = [rng.uniform(0.5, 1.5) for _ in range(30)]
                        kms[(side, c, k)] = med(samples)
                        rows[side].append({"case": c, "ms": med(samples), "samples_ms": samples,
                                           "path": "prefill", "sm90": side != "base" or c == "mla_a",
                                           "unit_blocks": 0})
            for side, rs in rows.items():
                write_jsonl(os.path.join(dk, f"ab_{side}_r{k}.jsonl"), rs)
        with open(os.path.join(dk, "ab_tests.json"), "w") as f:
            json.dump({"testsuites": [{"name": "CudaSm90Variants", "testsuite": [
                {"name": "A", "result": "COMPLETED", "time": "1s"},
                {"name": "B", "result": "COMPLETED", "time": "2s", "failures": [{"failure": "x"}]}]}]}, f)
        krec = run_record(dk, os.path.join(tmp, "kab.json"), "build abtests abkernels")
        expect(len(krec["kernel_ab"]["rounds"]) == kab_rounds, "kernel_ab rounds")
        expect(krec["kernel_ab"]["variants"][1]["options"] == ["--kernel-option", "sm90_mla_k64=1"],
               "kernel_ab options")
        mdk = tables(os.path.join(tmp, "kab.json"))
        print(mdk)
        for name, cs in kcases.items():
            for c in cs:
                line = next(ln for ln in mdk.splitlines() if ln.startswith(f"| {name} |") and f"| {c} |" in ln)
                base = [kms[("base", c, k)] for k in range(1, kab_rounds + 1)]
                var = [kms[(name, c, k)] for k in range(1, kab_rounds + 1)]
                ratios = [x / y for x, y in zip(base, var)]
                v = ("faster" if min(ratios) > 1 else "slower" if max(ratios) < 1 else "within noise")
                want = (f"{median_of(base):.4f} [{min(base):.4f}–{max(base):.4f}] | "
                        f"{median_of(var):.4f} [{min(var):.4f}–{max(var):.4f}] | "
                        f"{median_of(ratios):.3f} [{min(ratios):.3f}–{max(ratios):.3f}] | {v} |")
                expect(want in line, f"kernel_ab row {line!r} lacks {want!r}")
                expect(line.endswith("prefill sm90 |") and
                       ("prefill sm90 →" if c == "mla_a" else "prefill →") in line,
                       f"kernel_ab kernels {line!r}")
        expect("Variant tests: 1 / 2 passed; failed: CudaSm90Variants.B." in mdk, "ab tests line")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
