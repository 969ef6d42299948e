#!/usr/bin/env python3
"""The Markdown tables of pagoda's GPU results, generated from run records (bench/device/record.py).

Usage: tables.py RECORD.json [RECORD.json ...] [--out FILE]

Every table names the record's commit, GPU, driver and clocks. Nothing here is measured: every
number is the record's, or a median / ratio of its samples.

Kernel table (records with "kernels"): per case, ours = the median over rounds of each round's
median (pagoda_cuda_bench), with the range of the round medians; per peer, the peer's median and
the ratio peer / ours (> 1: pagoda faster) computed per round (round k's peer median over round
k's ours median), shown as median [min–max]. Verdict: "faster" when every round's ratio is > 1,
"slower" when every one is < 1, else "within noise" — no verdict is drawn from a single round
("1 round"). A peer cell says "refused" where the peer rejected the case and "n/a" where it has
no kernel of that kind (SDPA on fp8 K/V or with a prefix). Decode rows add % of the copy bandwidth, the others % of the GEMM rate (the
record's ceilings).

Decode step profile (records with "profile"): see profile_table. Hybrid models (records with
"hybrid", issue 49): see hybrid_table. DSA decode (records with "dsa", issue 50): see dsa_table."""
import argparse
import json
import statistics
import sys


def fmt(x, spec=".3f"):
    return "–" if x is None else format(x, spec)


def header(rec):
    if not rec.get("gpus") and rec.get("cpu"):  # a CPU run (run.sh kind cpu)
        return f"commit `{rec.get('commit', 'unknown')}`, {rec.get('date', '?')}, CPU {rec['cpu']}"
    g = (rec.get("gpus") or [{}])[0]
    n = len(rec.get("gpus") or [])
    v = rec.get("versions", {})
    soft = ", ".join(f"{k} {v[k]}" for k in ("torch", "cudnn", "flashinfer") if k in v)
    return (f"commit `{rec.get('commit', 'unknown')}`, {rec.get('date', '?')}, "
            f"{n} × {g.get('name', '?')} (driver {g.get('driver', '?')}, SM clock "
            f"{g.get('sm_mhz', '?')} now / {g.get('sm_max_mhz', '?')} max, memory "
            f"{g.get('mem_max_mhz', '?')} max)" + (f"; {soft}" if soft else ""))


def verdict(ratios):
    if len(ratios) < 2:
        return "1 round"
    if min(ratios) > 1:
        return "faster"
    if max(ratios) < 1:
        return "slower"
    return "within noise"


def kernel_rows(k):
    """{case: {"ours": [ms per round], "row": last ours row, "peers": {peer: [ms or None]}}}."""
    cases = {}
    rounds = k.get("rounds", [])
    for i, rnd in enumerate(rounds):
        for r in rnd.get("ours", []):
            c = cases.setdefault(r["case"], {"ours": [None] * len(rounds), "row": r, "peers": {}})
            c["ours"][i] = r["ms"]
        for p in rnd.get("peers", []):
            c = cases.get(p["case"])
            if c is None:
                continue
            c["peers"].setdefault(p["peer"], [None] * len(rounds))[i] = p.get("ms")
            if "skipped" in p:
                c.setdefault("skipped", set()).add(p["peer"])
    return cases


def kernel_table(rec):
    k = rec["kernels"]
    cases = kernel_rows(k)
    peers = sorted({p for c in cases.values() for p in c["peers"]})
    ceil = k.get("ceilings", {})
    n = len(k.get("rounds", []))
    out = [f"### Kernels ({n} interleaved rounds) — {header(rec)}", "",
           f"Policy: {k.get('policy', '?')}. Ceilings in the same run: copy "
           f"{fmt(ceil.get('copy_gbps'), '.0f')} GB/s, bf16 GEMM {fmt(ceil.get('gemm_tflops'), '.0f')} "
           "TFLOP/s. Peer cells: peer ms; ratio peer / ours per round, median [min–max] "
           "(> 1: pagoda faster); verdict.", "",
           "| case | path | ours ms [range] | % of ceiling | "
           + " | ".join(peers) + " |", "|" + "---|" * (4 + len(peers))]
    for name, c in cases.items():
        ours = [x for x in c["ours"] if x is not None]
        med = statistics.median(ours)
        r = c["row"]
        if name.startswith(("decode", "mla_decode")) and ceil.get("copy_gbps"):
            pct = f"{100 * r['bytes'] / (med * 1e-3) / 1e9 / ceil['copy_gbps']:.0f}% copy"
        elif ceil.get("gemm_tflops"):
            pct = f"{100 * r['flops'] / (med * 1e-3) / 1e12 / ceil['gemm_tflops']:.0f}% GEMM"
        else:
            pct = "–"
        cells = []
        for p in peers:
            pm = c["peers"].get(p, [])
            ratios = [b / a for a, b in zip(c["ours"], pm) if a and b]
            if not ratios:
                cells.append("n/a" if p in c.get("skipped", ()) else
                             "refused" if p in c["peers"] else "–")
                continue
            pms = [x for x in pm if x]
            cells.append(f"{statistics.median(pms):.4f}; {statistics.median(ratios):.3f} "
                         f"[{min(ratios):.3f}–{max(ratios):.3f}] {verdict(ratios)}")
        out.append(f"| {name} | {r.get('path', '?')} | {med:.4f} [{min(ours):.4f}–{max(ours):.4f}] "
                   f"| {pct} | " + " | ".join(cells) + " |")
    return out


def tests_table(rec):
    t = rec["tests"]
    passed = sum(x["status"] in ("run", "passed") for x in t)
    out = [f"### GPU tests — {header(rec)}", "", f"{passed} / {len(t)} passed.", "",
           "| test | status | s |", "|---|---|---|"]
    # ctest's JUnit file says "run" for a test that ran and passed
    word = {"run": "pass", "passed": "pass"}
    out += [f"| {x['name']} | {word.get(x['status'], x['status'])} | {x['seconds']:.1f} |"
            for x in t]
    for tool, lines in rec.get("sanitizers", {}).items():
        out += ["", f"compute-sanitizer {tool}: " + ("; ".join(lines) or "no summary line")]
    return out


def engine_table(rec):
    e = rec["engine"]
    out = [f"### Engine on random checkpoints of real layouts — {header(rec)}", "",
           f"Ceilings: copy {e.get('copy_bytes_per_s', 0) / 1e9:.0f} GB/s, GEMM "
           f"{e.get('gemm_flops', 0) / 1e12:.0f} TFLOP/s. Peer: transformers bf16 `generate` on the "
           "same lengths, in the same call.", "",
           "| layout | batch | pagoda decode step ms | step / roofline | pagoda output tok/s | "
           "transformers output tok/s | pagoda / transformers |", "|---|---|---|---|---|---|---|"]
    for layout, res in e.get("layouts", {}).items():
        for key, hf_key, bs in (("single", "hf_b1", 1), ("batch64", "hf_b64", 64)):
            if key not in res:
                continue
            ours = res[key].get("output_tokens_per_s")
            hf = res.get(hf_key, {}).get("output_tokens_per_s")
            out.append(f"| {layout} | {bs} | {fmt(res[key].get('decode_step_ms'))} | "
                       f"{fmt(res[key].get('step_over_roofline'), '.2f')} | {fmt(ours, '.0f')} | "
                       f"{fmt(hf, '.0f')} | {fmt(ours / hf if ours and hf else None, '.2f')}× |")
        pf = res.get("prefill2048")
        if pf:
            out.append(f"| {layout} | prefill 2048 | TTFT step {fmt(pf.get('extend_step_min_ms'))} ms | "
                       f"{fmt(100 * pf['prefill_fraction_of_gemm'] if pf.get('prefill_fraction_of_gemm') else None, '.0f')}% of GEMM | | | |")
        ab = res.get("prefill2048_absorbed")
        if pf and ab:  # MLA: the same prefill in the absorbed form (--mla-prefill absorbed)
            a_ms, e_ms = ab.get("extend_step_min_ms"), pf.get("extend_step_min_ms")
            out.append(f"| {layout} | prefill 2048 absorbed | TTFT step {fmt(a_ms)} ms | expanded "
                       f"{fmt(a_ms / e_ms if a_ms and e_ms else None, '.2f')}× faster | | | |")
        one, win = res.get("prefill8192_chunked_one_window"), res.get(
            "prefill8192_chunked_windows1024")
        if one and win:  # MLA: chunked prefill, prefixes in one key window vs windows of 1,024
            o_ms, w_ms = one.get("ttft_p50_ms"), win.get("ttft_p50_ms")
            out.append(f"| {layout} | prefill 8192 in chunks of 1024 | TTFT {fmt(o_ms)} ms one "
                       f"key window, {fmt(w_ms)} ms windows of 1024 keys | windows "
                       f"{fmt(o_ms / w_ms if o_ms and w_ms else None, '.2f')}× | | | |")
        ag = res.get("agreement")
        if ag:
            out.append(f"| {layout} | agreement | first token {ag['first_token_agree']}/{ag['prompts']} "
                       f"vs transformers f32; max logit diff {ag['max_abs_logit_diff']:.3f} | | | | |")
    return out


def agreement_table(rec):
    a = rec["agreement"]
    out = [f"### First token vs transformers fp32 (bench/agreement_vs_transformers.py) — {header(rec)}",
           "", f"pagoda on the {a.get('device', '?')} backend in its default dtype; 20 prompts of "
           "random ids per layout.", "",
           "| layout | prompt ids | first-token agreement | max abs logit diff | max abs logit |",
           "|---|---|---|---|---|"]
    for r in a.get("rows", []):
        out.append(f"| {r['layout']} | {r.get('length', '–')} | {r['first_token_agree']} / "
                   f"{r['prompts']} | {fmt(r.get('max_abs_logit_diff'), '.3g')} | "
                   f"{fmt(r.get('max_abs_logit'), '.3g')} |")
    if a.get("note"):
        out += ["", a["note"]]
    return out


def spec_table(rec):
    out = [f"### Speculative decoding A/B (same workload without, then with) — {header(rec)}", "",
           "| run | baseline out tok/s | spec out tok/s | speed-up | mean accept length | "
           "identical outputs |", "|---|---|---|---|---|---|"]
    for name, j in rec["spec"].items():
        s = j.get("spec", {})
        out.append(f"| {name} | {fmt(j.get('baseline_output_tokens_per_s'), '.0f')} | "
                   f"{fmt(j.get('spec_output_tokens_per_s'), '.0f')} | {fmt(j.get('speedup'), '.2f')}× | "
                   f"{fmt(s.get('mean_accept_length'), '.2f')} | {j.get('identical_outputs', '–')} |")
    return out


def serve_table(rec):
    s = rec["serve"]
    out = [f"### `pagoda serve` (OpenAI API) — {header(rec)}", "",
           "| concurrency | requests | req/s | output tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms "
           "| failed |", "|---|---|---|---|---|---|---|"]
    for r in s.get("runs", []):
        out.append(f"| {r['concurrency']} | {r['requests']} | {r['requests_per_s']:.2f} | "
                   f"{r['output_tokens_per_s']:.0f} | {r['ttft_p50_ms']:.1f} / {r['ttft_p99_ms']:.1f} | "
                   f"{r['tpot_p50_ms']:.2f} / {r['tpot_p99_ms']:.2f} | {r['failed']} |")
    c = s.get("compare")
    if c:
        per = " / ".join(f"{100 * p['ratio']:.1f} %" for p in c["pairs"])
        out += ["", f"Server vs `pagoda bench` (same engine settings, alternated): server / bench "
                    f"output tok/s per pair {per}; median {100 * c['median_ratio']:.1f} %."]
    return out


def tp_table(rec):
    t = rec["tp"]
    out = [f"### Tensor parallelism — {header(rec)}", "",
           "| layout | batch | tp 1 decode step ms | tp 2 decode step ms | tp 2 speed-up |",
           "|---|---|---|---|---|"]
    keys = sorted({k.rsplit("_tp", 1)[0] for k in t.get("bench", {})})
    for key in keys:
        a = t["bench"].get(key + "_tp1", {}).get("decode_step_ms")
        b = t["bench"].get(key + "_tp2", {}).get("decode_step_ms")
        layout, batch = key.split("_b")
        out.append(f"| {layout} | {batch} | {fmt(a)} | {fmt(b)} | "
                   f"{fmt(a / b if a and b else None, '.2f')}× |")
    g = t.get("generate_f32")
    if g:
        out += ["", f"Greedy f32 outputs, tp 2 vs tp 1: {g['identical']}/{g['prompts']} identical "
                    f"(first tokens {g['first_token_identical']}/{g['prompts']})."]
    return out


def hicache_table(rec):
    """Issue 43's multi-turn workload, device-only radix cache vs the host tier, per layout: hit
    rate, throughput, TTFT, the output digests (equal = identical outputs), bytes loaded back and
    the load stalls; the pinned copy bandwidth measured in the same call."""
    h = rec["hicache"]
    pc = h.get("pinned_copy") or {}
    out = [f"### HiCache: multi-turn workload, device-only vs host tier — {header(rec)}", "",
           f"Pinned host → device copy in the same call: {fmt(pc.get('h2d_pinned_gbps'), '.1f')} GB/s "
           "(torch, 1 GiB, median of 10).", "",
           "| layout | run | live KV / pool | prefix hit rate | output tok/s | TTFT p50 / p99 ms | "
           "device / host (/ storage) hit tokens | loaded back MB | load stalls (s) | leaked (device / host) "
           "| output digest |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(k for k in h if k != "pinned_copy" and not k.startswith("loadback_")):
        j = h[key]
        layout, run = key.rsplit("_", 1)
        t = j.get("hicache") or {}
        hits = (f"{t.get('device_hit_tokens', '–')} / {t.get('host_hit_tokens', '–')}" if t
                else f"{j.get('cached_tokens', '–')} / –")
        if t.get("storage_hit_tokens"):
            hits += f" / {t['storage_hit_tokens']} storage"
        out.append(f"| {layout} | {run} | {fmt(j.get('live_kv_over_pool'), '.1f')}× | "
                   f"{100 * j.get('prefix_hit_rate', 0):.1f} % | {fmt(j.get('output_tokens_per_s'), '.0f')} | "
                   f"{fmt(j.get('ttft_p50_ms'), '.0f')} / {fmt(j.get('ttft_p99_ms'), '.0f')} | {hits} | "
                   f"{fmt(t.get('bytes_h2d', 0) / 1e6 if t else None, '.1f')} | "
                   f"{t.get('load_stalls', '–')} ({fmt(t.get('load_stall_s'), '.3f')}) | "
                   f"{j.get('leaked_pages', '–')} / {t.get('leaked_host_pages', '–')} | "
                   f"`{j.get('output_digest', '–')}` |")
    probes = sorted(k for k in h if k.startswith("loadback_"))
    if probes:
        out += ["", "Load-back probe (`pagoda bench --workload loadback`): one request's TTFT for "
                "new tokens on a prefix that is cold (computed), in the device cache, or loaded back "
                "from the host tier per layer during the extend; median [min – max] over rounds; the "
                "copy rate is the loaded bytes over the whole host-case TTFT (a lower bound).", "",
                "| layout | prefix + new tokens | cold ms | device ms | host ms | host / device | "
                "cold / host | loaded MB | ≥ GB/s (of pinned) |", "|---|---|---|---|---|---|---|---|---|"]
        for key in probes:
            j = h[key]
            t = j.get("ttft_ms") or {}
            cell = {c: (f"{fmt(t[c]['median'], '.2f')} [{fmt(t[c]['min'], '.2f')} – "
                        f"{fmt(t[c]['max'], '.2f')}]" if c in t else "–")
                    for c in ("cold", "device", "host")}
            gbps = j.get("load_gbps_lower_bound")
            of = (f" ({100 * gbps / pc['h2d_pinned_gbps']:.0f} %)"
                  if gbps and pc.get("h2d_pinned_gbps") else "")
            out.append(f"| {key[len('loadback_'):]} | {j.get('prefix_tokens', '–')} + "
                       f"{j.get('extend_tokens', '–')} | {cell['cold']} | {cell['device']} | "
                       f"{cell['host']} | {fmt(j.get('host_over_device'), '.3f')}× | "
                       f"{fmt(j.get('cold_over_host'), '.2f')}× | "
                       f"{fmt(j.get('load_bytes', 0) / 1e6, '.1f')} | {fmt(gbps, '.1f')}{of} |")
    return out


def python_table(rec):
    """pagoda.flashinfer vs FlashInfer on the same torch tensors in one process
    (bench/python_vs_flashinfer.py): each side's median run() ms with its range, the ratio of the
    medians (> 1: pagoda faster) and plan() ms; then the torch tests' line and pagoda.LLM vs
    `pagoda bench` (bench/llm_vs_bench.py) where the record has them."""
    p = rec["python"]
    out = [f"### Python package: `pagoda.flashinfer` vs FlashInfer in one process — {header(rec)}", "",
           "| case | check (o err, lse err) | pagoda run ms [range] | flashinfer run ms [range] | "
           "flashinfer / pagoda | pagoda plan ms | flashinfer plan ms |", "|---|---|---|---|---|---|---|"]
    for r in p.get("vs_flashinfer", []):
        if "pagoda_ms" not in r:
            out.append(f"| {r.get('case')} | {r.get('error', 'no samples')} | | | | | |")
            continue
        a, b = r["pagoda_ms"], r["flashinfer_ms"]
        check = (f"{'ok' if r.get('ok') else 'MISMATCH'} ({r.get('o_err', 0):.1e}, "
                 f"{r.get('lse_err', 0):.1e})")
        out.append(f"| {r['case']} | {check} | {statistics.median(a):.3f} [{min(a):.3f}–{max(a):.3f}] | "
                   f"{statistics.median(b):.3f} [{min(b):.3f}–{max(b):.3f}] | "
                   f"{statistics.median(b) / statistics.median(a):.2f}× | "
                   f"{fmt(r.get('pagoda_plan_ms'))} | {fmt(r.get('flashinfer_plan_ms'))} |")
    if p.get("torch_tests"):
        out += ["", f"torch tests (tests/unit/python/test_flashinfer_torch.py): {p['torch_tests'][:200]}"]
    lb = p.get("llm_vs_bench")
    if lb:
        out += ["", f"`pagoda.LLM` vs `pagoda bench` ({lb.get('requests')} requests, "
                    f"{lb.get('input_len')} in / {lb.get('output_len')} out, {lb.get('backend')}): "
                    f"LLM {lb['median']['llm']:.0f}, bench {lb['median']['bench']:.0f} output tok/s; "
                    f"LLM / bench {100 * lb['ratio']:.1f} %."
                    + (f" A second generate() on the same engine: {lb['median']['llm_warm']:.0f}."
                       if "llm_warm" in lb["median"] else "")]
    return out


def profile_table(rec):
    """Per profiled layout and batch (bench/device/run.sh's profile group): the kernels of the
    last N decode steps grouped by name and grid, each group's mean time per step, its share of
    the measured step (the unprofiled `pagoda bench`'s decode_step_ms), DRAM bytes, GB/s and % of
    the copy ceiling; the step minus the kernel sum is the time between kernels (launch gaps)."""
    p = rec["profile"]
    copy = p.get("copy_gbps")
    out = []
    for tag, r in p.get("runs", {}).items():
        out += [f"### Decode step profile: {r.get('layout', tag)} layout, batch {r.get('batch', '?')} "
                f"— {header(rec)}", ""]
        if "error" in r:
            out += [f"No profile: {r['error'][:300]} (ncu rc {r.get('ncu_rc', '?')}).", ""]
            continue
        n = r["steps"]
        step_us = r.get("bench", {}).get("decode_step_ms")
        step_us = step_us * 1e3 if step_us else None
        ks = [x / 1e3 for x in r["step_ns"]]
        kern = statistics.mean(ks)
        nbytes = sum(sum(g["bytes"]) for g in r["groups"]) / n
        gbps = nbytes / (kern * 1e3)

        def pct_copy(x):
            return f"{100 * x / copy:.0f}%" if copy else "–"

        gap = (f"the rest, {step_us - kern:.1f} µs ({100 * (step_us - kern) / step_us:.1f} %), is time "
               "between kernels (launch gaps; negative where kernels overlap under programmatic "
               "dependent launch)" if step_us else "no unprofiled step time")
        out += [f"Measured decode step (`pagoda bench --json`, CUDA graphs, no profiler, "
                f"{r.get('timed_input_len', '?')} in / {r.get('timed_output_len', '?')} out): "
                f"{fmt(step_us, '.1f')} µs. Kernel time per step (ncu, the last {n} of "
                f"{r['forwards_seen']} forwards at context {r.get('input_len', '?')}+, "
                f"{statistics.mean(r['step_kernels']):.0f} kernels, "
                f"{'the same sequence every step' if r['uniform'] else 'sequences differ between steps'}): "
                f"{kern:.1f} µs [{min(ks):.1f}–{max(ks):.1f}] = "
                f"{fmt(100 * kern / step_us if step_us else None, '.1f')} % of the step; {gap}. "
                f"DRAM per step {nbytes / 1e6:.1f} MB, {gbps:.0f} GB/s over the kernel time = "
                f"{pct_copy(gbps)} of the copy ceiling ({fmt(copy, '.0f')} GB/s). ncu: "
                f"{r.get('ncu_passes') or '?'} pass(es) per kernel, launch-skip {r.get('launch_skip', '?')}, "
                f"{r['profiled_kernels']} kernels profiled.", "",
                "| kernel [grid] | launches per step | µs per step [min–max] | share of the step | "
                "MB per step | GB/s | % of copy ceiling | ncu DRAM % of peak |",
                "|---|---|---|---|---|---|---|---|"]
        for g in r["groups"]:
            us = [x / 1e3 for x in g["ns"]]
            mean_us = statistics.mean(us)
            mb = sum(g["bytes"]) / n / 1e6
            g_gbps = sum(g["bytes"]) / sum(g["ns"]) if sum(g["ns"]) else 0.0
            out.append(f"| `{g['name']}` | {statistics.mean(g['launches']):g} | {mean_us:.1f} "
                       f"[{min(us):.1f}–{max(us):.1f}] | "
                       f"{fmt(100 * mean_us / step_us if step_us else None, '.1f')} % | {mb:.2f} | "
                       f"{g_gbps:.0f} | {pct_copy(g_gbps)} | {g['dram_pct']:.0f}% |")
        if step_us:
            out.append(f"| time between kernels (step − kernel sum) | | {step_us - kern:.1f} | "
                       f"{100 * (step_us - kern) / step_us:.1f} % | | | | |")
        out.append("")
        ab = r.get("ab") or {}
        base = [x for x in ab.get("base", []) if x]
        for name, steps in ab.items():
            got = [x for x in steps if x]
            if name == "base" or not got or not base:
                continue
            ratios = [b / x for b, x in zip(ab["base"], steps) if b and x]
            out += [f"Option A/B (`pagoda bench`, the same step, {len(got)} alternating rounds): "
                    f"{name} {statistics.median(got):.4f} ms [{min(got):.4f}–{max(got):.4f}] "
                    f"against no option {statistics.median(base):.4f} ms [{min(base):.4f}–"
                    f"{max(base):.4f}]: base / {name} {statistics.median(ratios):.3f} "
                    f"[{min(ratios):.3f}–{max(ratios):.3f}], {verdict(ratios)}.", ""]
    if p.get("policy"):
        out.append(f"Policy: {p['policy']}.")
    return out


def amx_table(rec):
    """Issue 51 on the device host's CPU: the AMX / oneDNN gtests' results, the amx conformance
    line, attention (cpu and amx backends) vs torch SDPA per shape and thread count, and the CPU
    model per --cpu-gemm mode vs transformers bf16 (bench/cpu_vs_torch.py,
    bench/cpu_model_vs_torch.py: medians; torch timed in the same session)."""
    a = rec["amx"]
    out = [f"### Intel AMX CPU backend (issue 51) — commit `{rec.get('commit', 'unknown')}`, "
           f"{rec.get('date', '?')}, CPU {a.get('cpu', '?')}", "",
           f"CPU flags: {' '.join(a.get('cpu_flags', [])) or 'none of avx512* / amx*'}.", ""]
    for name, cases in a.get("gtests", {}).items():
        by = {}
        for c in cases:
            by.setdefault(c["result"], []).append(c["name"])
        counts = ", ".join(f"{len(v)} {k.lower()}" for k, v in sorted(by.items()))
        bad = by.get("FAILED", []) + by.get("SKIPPED", [])
        out.append(f"- {name}: {counts}" + (f" ({', '.join(bad[:8])})" if bad else ""))
    if a.get("conformance"):
        out.append(f"- `pagoda conformance --backends amx`: {a['conformance']}")
    rows = a.get("cpu_vs_torch") or []
    if rows:
        out += ["", "| threads | op (B, keys, q, heads q/kv, D, page) | backend | pagoda ms | torch SDPA ms "
                "| torch / pagoda |", "|---|---|---|---|---|---|"]
        for r in rows:
            shape = r.get("shape", [])
            desc = f"{shape[0]} ({', '.join(str(x) for x in shape[1:4])}, {shape[4]}/{shape[5]}, " \
                   f"{shape[6]}, {shape[7]})" if len(shape) == 8 else str(shape)
            tms = r.get("torch_ms")
            for key in sorted(k for k in r if k == "pagoda" or k.startswith("pagoda_")):
                p = r[key]
                if not isinstance(p, dict) or "ms" not in p:
                    continue
                out.append(f"| {r.get('threads')} | {desc} | {p.get('backend', key)} | {p['ms']:.2f} | "
                           f"{fmt(tms, '.2f')} | {fmt(tms / p['ms'] if tms else None, '.2f')}× |")
    m = a.get("cpu_model_vs_torch") or {}
    if m.get("rows"):
        out += [""] + cpu_model_table(m)
    return out


def cpu_model_table(m):
    """bench/cpu_model_vs_torch.py's document: per thread count and batch of N prompts, pagoda
    per --cpu-gemm mode and transformers bf16 generate on the same N prompts: output tok/s,
    decode ms per step (the whole batch), TTFT p50 (pagoda) / 1-token generate (transformers),
    pagoda's load time, and pagoda / transformers output tok/s (issue 51's target: >= 3x).
    Older documents (one request, no output tok/s) show their columns with '–' where absent."""
    args = m.get("args", {})
    out = [f"CPU model ({args.get('model', '?')}, prompt {args.get('input_len')}, "
           f"{args.get('output_len')} tokens per request):", "",
           "| threads | N | engine | output tok/s | decode ms / step | TTFT (pagoda) / prefill "
           "(transformers) ms | load s | pagoda / transformers tok/s |",
           "|---|---|---|---|---|---|---|---|"]
    for row in m.get("rows", []):
        n = row.get("requests", 1)
        head = f"| {row['threads']} | {n} |"
        if "skipped" in row:
            out.append(f"{head} skipped: {row['skipped']} | | | | | |")
            continue
        tr = row.get("torch") or {}
        t_tok = tr.get("output_tok_s")
        for mode, r in row.get("pagoda", {}).items():
            if "refused" in r:
                out.append(f"{head} pagoda {mode} | refused: {r['refused'][:120]} | | | | |")
                continue
            tok = r.get("output_tok_s")
            out.append(f"{head} pagoda {mode} | {fmt(tok, '.1f')} | {r['decode_ms']:.1f} | "
                       f"{r['ttft_ms']:.0f} | {fmt(r.get('load_s'), '.1f')} | "
                       f"{fmt(tok / t_tok if tok and t_tok else None, '.2f')}"
                       f"{'×' if tok and t_tok else ''} |")
        if "refused" in tr:
            out.append(f"{head} transformers | {tr['refused'][:120]} | | | | |")
        elif tr:
            out.append(f"{head} transformers {tr.get('torch', '')} bf16 | {fmt(t_tok, '.1f')} | "
                       f"{tr['decode_ms']:.1f} | {tr['prefill_ms']:.0f} | – | – |")
    return out


def ab_table(rec):
    """Engine-option A/B (kernel options, --overlap) of the decode step (bench/device/ab_options.py): per batch and
    variant, the step's median [min–max] over rounds and the ratio first variant / variant per
    round (> 1: the variant's step is shorter), median [min–max], with the verdict rule."""
    a = rec["ab"]
    out = [f"### Engine-option A/B, decode step ({a.get('model', '?')}, {a.get('input_len')} in / "
           f"{a.get('output_len')} out, CUDA graphs) — {header(rec)}", "",
           "| batch | variant | options | step ms [min–max] | first / variant | verdict |",
           "|---|---|---|---|---|---|"]
    names = [v["name"] for v in a["variants"]]
    opts = {v["name"]: " ".join(v["options"]) or "defaults" for v in a["variants"]}
    for bs in sorted({s["batch"] for s in a["samples"]}):
        by = {n: {} for n in names}
        for smp in a["samples"]:
            if smp["batch"] == bs:
                by[smp["variant"]][smp["round"]] = smp["decode_step_ms"]
        base = by[names[0]]
        for n in names:
            v = by[n]
            if not v:
                continue
            ratios = [base[r] / v[r] for r in sorted(v) if r in base]
            vs = list(v.values())
            cell = "–" if n == names[0] else \
                f"{statistics.median(ratios):.3f} [{min(ratios):.3f}–{max(ratios):.3f}]"
            out.append(f"| {bs} | {n} | {opts[n]} | {statistics.median(vs):.4f} "
                       f"[{min(vs):.4f}–{max(vs):.4f}] | {cell} | "
                       f"{'–' if n == names[0] else verdict(ratios)} |")
    return out


def kernel_ab_table(rec):
    """Kernel-option A/B (bench/device/run.sh ab_kernels): per variant and case, the base's and the
    variant's median over rounds of each round's median [range], the ratio base / variant per
    round (> 1: the variant faster), median [min–max], with the verdict rule; the kernel each
    side's plan was made for (sm90 or not, unit-list blocks) from the last round's rows. Then
    the variant tests' counts and failures (ab_tests)."""
    k = rec["kernel_ab"]
    rounds = k.get("rounds", [])
    out = [f"### Kernel-option A/B ({len(rounds)} interleaved rounds) — {header(rec)}", "",
           f"Policy: {k.get('policy', '?')}.", "",
           "| variant | options | case | base ms [range] | variant ms [range] | base / variant "
           "[min–max] | verdict | kernel (base → variant) |", "|---|---|---|---|---|---|---|---|"]

    def per_round(name):
        """{case: [ms or None per round]}, and the last row of each case."""
        ms, last = {}, {}
        for i, rnd in enumerate(rounds):
            for r in rnd.get(name, []):
                ms.setdefault(r["case"], [None] * len(rounds))[i] = r["ms"]
                last[r["case"]] = r
        return ms, last

    def kernel(r):
        if r is None:
            return "?"
        word = r.get("path", "?") + (" sm90" if r.get("sm90") else "")
        return word + (f" lists {r['unit_blocks']}" if r.get("unit_blocks") else "")

    base, base_last = per_round("base")
    for v in k.get("variants", []):
        ms, last = per_round(v["name"])
        for case, vs in ms.items():
            bs = base.get(case, [])
            ratios = [b / x for b, x in zip(bs, vs) if b and x]
            got = [x for x in vs if x]
            ref = [x for x in bs if x]
            cell = (f"{statistics.median(ratios):.3f} [{min(ratios):.3f}–{max(ratios):.3f}]"
                    if ratios else "–")
            out.append(
                f"| {v['name']} | {' '.join(v['options'])} | {case} | "
                + (f"{statistics.median(ref):.4f} [{min(ref):.4f}–{max(ref):.4f}]" if ref else "–")
                + f" | {statistics.median(got):.4f} [{min(got):.4f}–{max(got):.4f}] | {cell} | "
                + f"{verdict(ratios) if ratios else '–'} | {kernel(base_last.get(case))} → "
                + f"{kernel(last.get(case))} |")
    t = rec.get("ab_tests")
    if t:
        failed = [x["name"] for x in t if x["result"] == "FAILED"]
        out += ["", f"Variant tests: {len(t) - len(failed)} / {len(t)} passed"
                + (f"; failed: {', '.join(failed)}" if failed else "") + "."]
    for tool, lines in rec.get("sanitizers", {}).items():
        out += ["", f"compute-sanitizer {tool}: " + ("; ".join(lines) or "no summary line")]
    return out


def hybrid_table(rec):
    """Issue 49's hybrid benchmarks (bench/device/run.sh's hybrid group). Gemma-3 layout, one
    request: KV bytes per request = full-pool pages held (peak_kv_tokens / page) x the full pool's
    bytes per page + the most SWA pages the request held x the SWA pool's bytes per page (bytes
    per page = the pool's allocation / (its pages + the reserved page 0)); the decode step and
    its ratio on / off. One byte budget: the pools each run sized, the requests whose KV the full
    pool held at its peak (peak_kv_tokens / the context) and the most requests that decoded
    together (fewer when a request finishes decoding before the next one's prefill ends). Bamba: the decode step at two lengths, the attention decode kernel at
    both (times the attention layers) and the step less it; the Mamba2 scan against the copy
    bandwidth and GEMM rate of the same process; turn 2's TTFT with the cache vs without."""
    h = rec["hybrid"]
    m = h.get("meta", {})
    out = [f"### Hybrid models (issue 49): sliding-window pool and Mamba2 — {header(rec)}", "",
           f"Backend `{m.get('backend', '?')}`, {m.get('dtype', '?')} weights and KV.", ""]

    def failed(j):  # a run that did not run, or failed (its error, run.sh's hy)
        return "not run" if not j else f"failed (rc {j.get('rc')}): {j['error'][-160:].strip()}"

    def page_bytes(j, swa):
        n, b = (j.get("swa_pool_pages", 0), j.get("swa_kv_bytes", 0)) if swa else \
            (j.get("pages_total", 0), j.get("kv_bytes", 0))
        return b / (n + 1) if n else 0.0

    steps = {k: h.get(f"swa_step_{k}") for k in ("off", "on")}
    if any(steps.values()):
        out += [f"Gemma-3 layout `{m.get('gemma_layout', '?')}`, one request of {m.get('swa_ctx', '?')} "
                f"tokens (prompt + 128 out), radix cache off, chunks of {m.get('swa_chunk', '?')}, page 16:", "",
                "| pools | full pages held | SWA pages held (peak) | KV bytes per request | vs one pool "
                "| decode step ms | vs one pool |", "|---|---|---|---|---|---|---|"]
        base = {}
        for k, j in steps.items():
            if not j or "error" in j:
                out.append(f"| {k} | {failed(j)} | | | | | |")
                continue
            full = j["peak_kv_tokens"] / j["page_size"]
            swa = j.get("swa_peak_pages_per_request", 0) if j.get("swa_pool_pages") else 0
            kvb = full * page_bytes(j, False) + swa * page_bytes(j, True)
            step = j.get("decode_step_ms")
            if k == "off":
                base = {"kvb": kvb, "step": step}
            name = "one full pool (window as a mask)" if k == "off" else "window layers in the SWA pool"
            out.append(f"| {name} | {full:.0f} | {swa if k == 'on' else '–'} | {kvb / 2**20:.1f} MiB | "
                       f"{fmt(kvb / base['kvb'] if base.get('kvb') else None)}× | {fmt(step)} | "
                       f"{fmt(step / base['step'] if base.get('step') and step else None)}× |")
        out.append("")
    fits = {k: h.get(f"swa_fit_{k}") for k in ("off", "on")}
    if any(fits.values()):
        out += [f"One KV byte budget for both ({m.get('swa_budget_bytes', 0) / 2**20:.0f} MiB: 2.5 such "
                f"requests in one full pool; SWA pool at 0.1 of the full pool's tokens), "
                f"{m.get('swa_requests', '?')} requests queued:", "",
                "| pools | full pool tokens | SWA pool tokens | requests held at once (peak full-pool KV "
                "/ request) | requests decoding together (max) | vs one pool | failed |",
                "|---|---|---|---|---|---|---|"]
        n0 = (fits.get("off") or {}).get("decode_batch_max")
        for k, j in fits.items():
            if not j or "error" in j:
                out.append(f"| {k} | {failed(j)} | | | | | |")
                continue
            n = j.get("decode_batch_max")
            held = j["peak_kv_tokens"] / m["swa_ctx"] if j.get("peak_kv_tokens") and m.get("swa_ctx") else None
            out.append(f"| {'one full pool' if k == 'off' else 'SWA pool'} | {j.get('pool_tokens')} | "
                       f"{j.get('swa_pool_pages', 0) * j.get('page_size', 0) or '–'} | {fmt(held, '.2f')} | {n} | "
                       f"{fmt(n / n0 if n and n0 else None, '.1f')}× | {j.get('failed_requests')} |")
        out.append("")
    short, long_ = m.get("mamba_short"), m.get("mamba_long")
    ms = {c: h.get(f"mamba_step_{c}") for c in (short, long_)}
    if any(ms.values()):
        na = m.get("attention_layers", 0)
        out += [f"Bamba layout `{m.get('bamba_layout', '?')}` ({na} attention layers), decode at batch 1 "
                "(256 steps; no CUDA graphs for hybrid models): the step, the attention decode kernel alone "
                "(`pagoda kernels --op decode`, the model's attention shape) times the attention "
                "layers, and the step less that:", "",
                "| context | decode step ms | attention kernels ms | step − attention ms |",
                "|---|---|---|---|"]
        rest = {}
        for c, j in ms.items():
            a = (h.get(f"attn_decode_{c}") or {}).get("ms")
            step = (j or {}).get("decode_step_ms")
            rest[c] = step - na * a if step and a is not None else None
            out.append(f"| {c} | {fmt(step)} | {fmt(na * a if a is not None else None)} | {fmt(rest[c])} |")
        s0, s1 = ((ms[c] or {}).get("decode_step_ms") for c in (short, long_))
        r0, r1 = rest.get(short), rest.get(long_)
        out += ["", f"{long_} / {short}: step {fmt(s1 / s0 if s0 and s1 else None)}×, step − attention "
                    f"{fmt(r1 / r0 if r0 and r1 else None)}× (target for the linear layers: within 10 %).",
                ""]
    scans = [(k, h[k]) for k in ("scan_decode", "scan_prefill") if h.get(k)]
    if scans:
        out += ["Mamba2 scan (`pagoda kernels --op linear-*`, the model's mixer shape; bytes: states read "
                "and written once + xBC, dt and y rows; FLOPs: conv + 5 per state element per token):", "",
                "| op | sequences × tokens | ms per layer [min] | tokens/s | GB/s | % of copy | TFLOP/s | "
                "% of GEMM | copy GB/s (same run) |", "|---|---|---|---|---|---|---|---|---|"]
        for k, j in scans:
            out.append(f"| {j['op']} ({j.get('backend')}) | {j['batch']} × {j['tokens']} | {j['ms']:.4f} "
                       f"[{j['ms_min']:.4f}] | {j['tokens_per_s']:.3g} | {j['gbps']:.1f} | "
                       f"{j['pct_of_copy']:.1f} % | {j['tflops']:.3f} | {j['pct_of_gemm']:.2f} % "
                       f"({j.get('gemm_kind')}) | {j['copy_gbps']:.0f} ({j.get('copy_kind')}) |")
        out.append("")
    tt = {k: h.get(f"ttft_{k}") for k in ("cached", "cold")}
    if any(tt.values()):
        def turn2(j):
            t = (j or {}).get("ttft_by_turn_ms") or []
            return t[1] if len(t) > 1 else None
        a, b = turn2(tt["cached"]), turn2(tt["cold"])
        out += [f"Prefix hit restoring the state: one conversation, turn 2 over a {m.get('prefix', '?')}-token "
                "system prompt + turn 1 (64-token question, 16-token answer):", "",
                "| run | turn 1 TTFT ms | turn 2 TTFT ms | prefix hit rate | output digest |",
                "|---|---|---|---|---|"]
        for k, j in tt.items():
            t = (j or {}).get("ttft_by_turn_ms") or []
            out.append(f"| {'radix cache (state snapshot restored)' if k == 'cached' else '--no-radix (cold)'} | "
                       f"{fmt(t[0] if t else None, '.1f')} | {fmt(turn2(j), '.1f')} | "
                       f"{100 * (j or {}).get('prefix_hit_rate', 0):.1f} % | `{(j or {}).get('output_digest', '–')}` |")
        out += ["", f"Turn 2 cached / cold: {fmt(a / b if a and b else None)}× (target ≤ 0.2×)."]
    return out


def dsa_table(rec):
    """Issue 50's DSA decode step (bench/device/run.sh's dsa group, `pagoda kernels --op
    dsa-decode`): per shape the dense MLA decode forward and one DSA layer (indexer + sparse
    attention as a model runs them), with the indexer and the sparse forward timed apart and the
    step's first layer (which also builds the step's sparse plan), medians of interleaved
    samples; DSA / dense against the issue's target (≤ 0.25×); GB/s of the rows each reads
    against the copy bandwidth of the same process. Records before the device-side selection
    (no first_layer_ms) timed the indexer with the selection back on the host and a host plan
    per layer: their DSA column is indexer + sparse (plan, attention)."""
    out = [f"### DSA decode step vs dense MLA (issue 50) — {header(rec)}", "",
           "| shape | dense ms | DSA layer ms | indexer ms | sparse attention ms | first layer ms "
           "| DSA / dense | dense GB/s | indexer GB/s (index rows) | indexer TFLOP/s | copy GB/s |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, j in sorted(rec["dsa"].items()):
        if "dense_ms" not in j:
            out.append(f"| {name} | failed |" + " |" * 9)
            continue
        if "first_layer_ms" in j:
            attn, first = fmt(j["sparse_attention_ms"], ".3f"), fmt(j["first_layer_ms"], ".3f")
        else:  # the host-side selection: sparse = host plan + attention
            attn = f"{fmt(j['sparse_ms'], '.3f')} (host plan + attention)"
            first = "—"
        out.append(f"| B{j['batch']} L{j['kv_len']} h{j['q_heads']} top-{j['topk']} | "
                   f"{fmt(j['dense_ms'], '.3f')} | {fmt(j['dsa_ms'], '.3f')} | "
                   f"{fmt(j['indexer_ms'], '.3f')} | {attn} | {first} | "
                   f"{fmt(j['dsa_over_dense'], '.3f')}× | "
                   f"{fmt(j['dense_gbps'], '.0f')} | {fmt(j['indexer_gbps'], '.0f')} | "
                   f"{fmt(j['indexer_tflops'], '.2f')} | {fmt(j['copy_gbps'], '.0f')} |")
    out += ["", "Target (H200): DSA / dense ≤ 0.25× at 128k, batch 16."]
    return out


SECTIONS = (("tests", tests_table), ("kernels", kernel_table), ("kernel_ab", kernel_ab_table), ("engine", engine_table),
            ("agreement", agreement_table),
            ("spec", spec_table), ("serve", serve_table), ("tp", tp_table), ("hicache", hicache_table),
            ("python", python_table), ("profile", profile_table), ("amx", amx_table),
            ("ab", ab_table), ("hybrid", hybrid_table), ("dsa", dsa_table))


def render(records):
    out = ["# pagoda GPU results (generated by bench/tables.py from bench/results/records/)", ""]
    for rec in records:
        for key, fn in SECTIONS:
            if rec.get(key):
                out += fn(rec) + [""]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("records", nargs="+")
    ap.add_argument("--out")
    a = ap.parse_args()
    records = sorted((json.load(open(p)) for p in a.records), key=lambda r: r.get("date", ""))
    text = render(records)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
