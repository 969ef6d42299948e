#!/usr/bin/env python3
"""Admission under a small KV pool (issue 48): one `pagoda serve` run of `bench/serve_bench.py`'s
ShareGPT-like closed-loop load at concurrency 64, while a thread samples /metrics every 50 ms.

Prints one line: TTFT p50 / p99, output tok/s, and over the middle 60 % of the samples the mean
KV pages in use (not on the free list) / cached (held by the prefix cache) / total, the mean
running and waiting requests, and the retractions counted by the end.

    python3 bench/serve_admission.py --pagoda build/pagoda --pool-tokens 16384
    python3 bench/serve_admission.py --pagoda build/pagoda --pool-tokens 16384 \\
        --output-median 256 --max-output 1024 --requests 256
"""
import argparse
import asyncio
import pathlib
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "unit" / "server"))
import serve_bench  # noqa: E402
from serve_harness import Server  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--pool-tokens", type=int, default=65536)
    ap.add_argument("--chunk-size", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=384)
    ap.add_argument("--seed", type=int, default=64)
    ap.add_argument("--output-median", type=int, default=64)
    ap.add_argument("--max-output", type=int, default=256)
    a = ap.parse_args()
    s = Server(a.pagoda, "--pool-tokens", str(a.pool_tokens), "--max-running", "64",
               "--chunk-size", str(a.chunk_size), "--max-queue", "4096")
    samples, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            samples.append(s.metrics())
            time.sleep(0.05)

    t = threading.Thread(target=poll)
    t.start()
    try:
        lengths = serve_bench.sharegpt_like(a.requests, a.seed, 128, a.output_median, 1024,
                                            a.max_output)
        r = asyncio.run(serve_bench.run_load(s.url, "builtin", lengths, 256, a.concurrency,
                                             float("inf"), 0, ""))
    finally:
        stop.set()
        t.join()
        last = s.metrics()
        s.stop()
    mid = samples[len(samples) // 5: len(samples) - len(samples) // 5] or samples
    mean = lambda k: sum(x.get(k) for x in mid) / len(mid)  # noqa: E731
    print(f"pool {a.pool_tokens} chunk {a.chunk_size}: TTFT p50 {r['ttft_p50_ms']:.0f} ms "
          f"p99 {r['ttft_p99_ms']:.0f} ms, {r['output_tokens_per_s']:.0f} out tok/s, "
          f"failed {r['failed']} | pages used {mean('pagoda_kv_pages_used'):.0f} cached "
          f"{mean('pagoda_kv_pages_cached'):.0f} of {mean('pagoda_kv_pages_total'):.0f}, "
          f"running {mean('pagoda_requests_running'):.1f} waiting "
          f"{mean('pagoda_requests_waiting'):.1f}, retractions "
          f"{last.get('pagoda_retractions_total'):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
