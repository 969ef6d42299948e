#!/usr/bin/env python3
"""Serving benchmark for `pagoda serve`, shaped like `vllm bench serve`.

Requests arrive as a Poisson process (--request-rate, req/s; inf = all at once) under a cap of
in-flight requests (--max-concurrency, the closed-loop limit), with ShareGPT-like input / output
lengths: log-normal, drawn from --seed (medians --input-median / --output-median tokens, clipped).
Prompts are random token ids, so the input length is exact; ignore_eos makes every request
produce its output length. Each request streams (/v1/completions, stream_options.include_usage)
and records TTFT (first streamed event), TPOT ((latency - TTFT) / (output tokens - 1)) and its
latency. Reported per concurrency: request and output-token throughput, TTFT / TPOT p50 / p99.

The comparison row runs `pagoda bench --input-len I --output-len O --requests R` (the engine with
no HTTP in between) and then the server on the same model, engine settings and fixed lengths at
concurrency --compare-concurrency, and reports server output tok/s as a fraction of the bench's
(target: >= 0.90 at concurrency 64).

    python3 bench/serve_bench.py --pagoda build/pagoda --model builtin --out bench/results/serve_raw
    python3 bench/serve_bench.py --url http://127.0.0.1:30000 --model builtin --no-compare

Only the Python standard library: the client speaks HTTP/1.1 over asyncio streams itself (the
GPU image cannot install packages), one connection per request.
"""
import argparse
import asyncio
import json
import math
import os
import pathlib
import random
import subprocess
import sys
import time

import urllib.parse

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "unit" / "server"))
from serve_harness import Server  # noqa: E402


def sharegpt_like(n, seed, input_median, output_median, max_input, max_output):
    """(input_len, output_len) pairs: log-normal like ShareGPT's (long right tails)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        i = int(rng.lognormvariate(math.log(input_median), 0.9))
        o = int(rng.lognormvariate(math.log(output_median), 0.8))
        out.append((min(max(4, i), max_input), min(max(2, o), max_output)))
    return out


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


async def http_post(url, body, headers):
    """POST `body` (JSON) to `url`; yields (status, None) once, then each body line (text)."""
    u = urllib.parse.urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port or 80)
    data = json.dumps(body).encode()
    head = [f"POST {u.path} HTTP/1.1", f"Host: {u.hostname}:{u.port}", "Content-Type: application/json",
            f"Content-Length: {len(data)}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
    await writer.drain()
    try:
        status = int((await reader.readline()).split()[1])
        length, chunked = None, False
        while True:
            line = (await reader.readline()).decode().strip()
            if not line:
                break
            k, _, v = line.partition(":")
            if k.lower() == "content-length":
                length = int(v)
            if k.lower() == "transfer-encoding" and "chunked" in v.lower():
                chunked = True
        yield status, None
        buf = b""
        if chunked:
            while True:
                size = int((await reader.readline()).strip() or b"0", 16)
                if size == 0:
                    break
                buf += await reader.readexactly(size + 2)
                buf = buf[:-2] if buf.endswith(b"\r\n") else buf
                *lines, buf = buf.split(b"\n")
                for ln in lines:
                    yield None, ln.decode(errors="replace")
        else:
            buf = await reader.readexactly(length) if length else await reader.read()
        for ln in buf.split(b"\n"):
            if ln:
                yield None, ln.decode(errors="replace")
    finally:
        writer.close()


async def one_request(url, model, prompt_ids, max_tokens, headers, stream):
    body = {"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    t0 = time.perf_counter()
    ttft, n_out, ok = None, 0, False
    async for status, line in http_post(url + "/v1/completions", body, headers):
        if status is not None:
            if status != 200:
                return {"ok": False, "status": status}
            continue
        if not stream:
            n_out = json.loads(line)["usage"]["completion_tokens"]
            ok = True
            break
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            ok = True
            break
        if ttft is None:
            ttft = time.perf_counter() - t0
        ev = json.loads(line[6:])
        if ev.get("usage"):
            n_out = ev["usage"]["completion_tokens"]
    lat = time.perf_counter() - t0
    ttft = ttft if ttft is not None else lat
    tpot = (lat - ttft) / (n_out - 1) if n_out > 1 and stream else None
    return {"ok": ok, "ttft": ttft if stream else None, "tpot": tpot, "latency": lat, "out": n_out}


async def run_load(url, model, lengths, vocab, concurrency, rate, seed, api_key, stream=True):
    rng = random.Random(seed + 1)
    prompts = [[rng.randrange(1, vocab) for _ in range(i)] for i, _ in lengths]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    sem = asyncio.Semaphore(concurrency)
    results = []

    async def go(k):
        async with sem:
            results.append(await one_request(url, model, prompts[k], lengths[k][1], headers, stream))

    tasks = []
    t0 = time.perf_counter()
    for k in range(len(lengths)):
        tasks.append(asyncio.create_task(go(k)))
        if rate != float("inf"):
            await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    good = [r for r in results if r["ok"]]
    out_tokens = sum(r["out"] for r in good)
    ms = lambda xs, p: 1e3 * percentile([x for x in xs if x is not None], p)  # noqa: E731
    return {"concurrency": concurrency, "requests": len(lengths), "completed": len(good),
            "failed": len(results) - len(good), "wall_s": wall,
            "input_tokens": sum(i for i, _ in lengths), "output_tokens": out_tokens,
            "requests_per_s": len(good) / wall, "output_tokens_per_s": out_tokens / wall,
            "ttft_p50_ms": ms([r["ttft"] for r in good], 50), "ttft_p99_ms": ms([r["ttft"] for r in good], 99),
            "tpot_p50_ms": ms([r["tpot"] for r in good], 50), "tpot_p99_ms": ms([r["tpot"] for r in good], 99),
            "stream": stream}


def engine_args(a):
    return ["--page-size", str(a.page_size), "--pool-tokens", str(a.pool_tokens),
            "--max-running", str(a.max_running), "--chunk-size", str(a.chunk_size),
            "--policy", a.policy, *a.engine_extra.split()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", help="the pagoda binary (starts `pagoda serve` itself)")
    ap.add_argument("--url", help="an already running server (no comparison then)")
    ap.add_argument("--model", default="builtin")
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--api-key", default="")
    ap.add_argument("--vocab", type=int, default=256, help="prompt ids are drawn from [1, vocab)")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--num-prompts", type=int, default=0, help="per concurrency (0 = max(24, 4 x c))")
    ap.add_argument("--request-rate", type=float, default=float("inf"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--input-median", type=int, default=128)
    ap.add_argument("--output-median", type=int, default=64)
    ap.add_argument("--max-input", type=int, default=1024)
    ap.add_argument("--max-output", type=int, default=256)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--pool-tokens", type=int, default=65536)
    ap.add_argument("--max-running", type=int, default=64)
    ap.add_argument("--chunk-size", type=int, default=256)
    ap.add_argument("--policy", default="fcfs", help="fcfs or lpm (both for serve and bench)")
    ap.add_argument("--engine-extra", default="", help="more options for both serve and bench")
    ap.add_argument("--no-compare", action="store_true")
    ap.add_argument("--compare-concurrency", type=int, default=64)
    ap.add_argument("--compare-input-len", type=int, default=128)
    ap.add_argument("--compare-output-len", type=int, default=64)
    ap.add_argument("--compare-requests", type=int, default=256)
    ap.add_argument("--compare-repeats", type=int, default=3)
    ap.add_argument("--compare-stream", action="store_true",
                    help="stream the comparison requests too (default: plain JSON answers, so the "
                         "Python client's per-token work does not limit the measurement)")
    ap.add_argument("--out", default=None, help="folder for results.json, table.md and the server log")
    a = ap.parse_args()
    out = pathlib.Path(a.out) if a.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    name = a.served_model_name or (a.model if a.model == "builtin" else pathlib.Path(a.model).name)
    report = {"model": a.model, "seed": a.seed, "runs": [], "args": dict(vars(a))}
    report["args"]["request_rate"] = str(a.request_rate)
    try:  # the tree measured
        report["commit"] = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                                          text=True, cwd=pathlib.Path(__file__).parent).stdout.strip()
    except OSError:
        pass
    report["load_average_at_start"] = os.getloadavg()

    compare = not a.no_compare and a.pagoda and not a.url
    bench_cmd = [a.pagoda, "bench", "--model", a.model, "--input-len", str(a.compare_input_len),
                 "--output-len", str(a.compare_output_len), "--requests", str(a.compare_requests),
                 *engine_args(a), "--json"]

    def run_bench():
        # The server is idle meanwhile (both on one machine: never measured at the same time).
        print("running", " ".join(bench_cmd), flush=True)
        return json.loads(subprocess.run(bench_cmd, capture_output=True, text=True, check=True).stdout)

    server = None
    url = a.url
    if not url:
        server_args = ["--model", a.model, *engine_args(a), "--max-queue", "4096"]
        if a.api_key:
            server_args += ["--api-key", a.api_key]
        server = Server(a.pagoda, *server_args, log=str(out / "server.log") if out else None)
        url = server.url
    try:
        if compare:
            lengths = [(a.compare_input_len, a.compare_output_len)] * a.compare_requests
            asyncio.run(run_load(url, name, lengths[:8], a.vocab, 8, float("inf"), a.seed, a.api_key))  # warm-up
            pairs = []
            for rep in range(a.compare_repeats):  # alternate, so drifting machine load hits both
                b = run_bench()
                r = asyncio.run(run_load(url, name, lengths, a.vocab, a.compare_concurrency,
                                         float("inf"), a.seed, a.api_key, a.compare_stream))
                r["kind"] = "fixed"
                ratio = r["output_tokens_per_s"] / b["output_tokens_per_s"]
                pairs.append({"bench": b, "server": r, "ratio": ratio})
                print(f"[{rep}] fixed {a.compare_input_len}/{a.compare_output_len} x {a.compare_requests}: "
                      f"server {r['output_tokens_per_s']:.0f} out tok/s at c={a.compare_concurrency}, "
                      f"pagoda bench {b['output_tokens_per_s']:.0f} -> {ratio:.3f}", flush=True)
            ratios = sorted(p["ratio"] for p in pairs)
            report["compare"] = {"pairs": pairs, "median_ratio": ratios[len(ratios) // 2],
                                 "min_ratio": ratios[0], "max_ratio": ratios[-1]}
        for c in [int(x) for x in a.concurrency.split(",")]:
            n = a.num_prompts or max(24, 4 * c)
            lengths = sharegpt_like(n, a.seed + c, a.input_median, a.output_median, a.max_input, a.max_output)
            r = asyncio.run(run_load(url, name, lengths, a.vocab, c, a.request_rate, a.seed, a.api_key))
            r["kind"] = "sharegpt-like"
            report["runs"].append(r)
            print(json.dumps(r), flush=True)
        if server:
            report["health_after"] = server.get_json("/health")[1]
        report["load_average_at_end"] = os.getloadavg()
    finally:
        if server:
            report["server_exit"] = server.stop()

    lines = ["| concurrency | requests | req/s | output tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | failed |",
             "|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        lines.append(f"| {r['concurrency']} | {r['requests']} | {r['requests_per_s']:.2f} | "
                     f"{r['output_tokens_per_s']:.0f} | {r['ttft_p50_ms']:.1f} / {r['ttft_p99_ms']:.1f} | "
                     f"{r['tpot_p50_ms']:.2f} / {r['tpot_p99_ms']:.2f} | {r['failed']} |")
    if "compare" in report:
        cmp = report["compare"]
        lines += ["", f"Fixed {a.compare_input_len} in / {a.compare_output_len} out x {a.compare_requests} "
                      f"requests, server at concurrency {a.compare_concurrency} "
                      f"({'streamed' if a.compare_stream else 'non-streamed'}) vs `pagoda bench` (same "
                      f"engine settings, alternated {a.compare_repeats} times):", "",
                  "| run | server output tok/s | pagoda bench output tok/s | server / bench |",
                  "|---|---|---|---|"]
        for k, p in enumerate(cmp["pairs"]):
            lines.append(f"| {k} | {p['server']['output_tokens_per_s']:.0f} | "
                         f"{p['bench']['output_tokens_per_s']:.0f} | {100 * p['ratio']:.1f} % |")
        lines += ["", f"Median **{100 * cmp['median_ratio']:.1f} %** (min {100 * cmp['min_ratio']:.1f} %, "
                      f"max {100 * cmp['max_ratio']:.1f} %; target >= 90 %)."]
    table = "\n".join(lines)
    print(table)
    if out:
        (out / "results.json").write_text(json.dumps(report, indent=1))
        (out / "table.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
