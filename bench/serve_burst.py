#!/usr/bin/env python3
"""Connection-burst benchmark for `pagoda serve`: bursts of simultaneous NEW connections.

Each round opens --connections TCP connections at the same instant (a barrier releases one thread
per connection), sends one streamed /v1/completions request on each and records its TTFT: from
just before connect() to the first server-sent event. A listen queue shorter than the burst makes
the kernel drop connection attempts, which the client retries after its 1 s SYN timeout: that
shows up as a TTFT around 1 s and as a rise of the kernel's TcpExtListenOverflows counter
(/proc/net/netstat, machine-wide). Reported: TTFT p50 / p99 / max over every request, how many
took over 1 s, the overflow counter's rise, and failed requests.

    python3 bench/serve_burst.py --pagoda build/pagoda [--rounds 5 --connections 32]
    python3 bench/serve_burst.py --url http://127.0.0.1:30000

Standard library only (the GPU image cannot install packages).
"""
import argparse
import json
import math
import pathlib
import socket
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "unit" / "server"))
from serve_harness import Server  # noqa: E402


def percentile(xs, p):
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def listen_overflows():
    """TcpExtListenOverflows from /proc/net/netstat (None where unreadable)."""
    try:
        lines = pathlib.Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return None
    for names, values in zip(lines[0::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:]))
            return int(table.get("ListenOverflows", 0))
    return None


def one_request(host, port, body, barrier, out, i):
    req = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
           f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
           f"Connection: close\r\n\r\n").encode() + body
    barrier.wait()
    t0 = time.perf_counter()
    try:
        with socket.create_connection((host, port), timeout=60) as s:
            s.sendall(req)
            buf, ttft = b"", None
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
                if ttft is None and b"data: " in buf:
                    ttft = time.perf_counter() - t0
                if b"data: [DONE]" in buf:
                    break
        ok = ttft is not None and b" 200 " in buf.split(b"\r\n", 1)[0] + b" " and b"[DONE]" in buf
        out[i] = ttft if ok else None
    except OSError:
        out[i] = None


def burst(host, port, n, body):
    barrier = threading.Barrier(n)
    out = [None] * n
    threads = [threading.Thread(target=one_request, args=(host, port, body, barrier, out, i))
               for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", help="start `pagoda serve --model builtin` with this binary")
    ap.add_argument("--url", help="an already running server instead")
    ap.add_argument("--serve-args", default="", help="extra `pagoda serve` arguments")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    if not (args.pagoda or args.url):
        ap.error("--pagoda or --url is required")
    server = Server(args.pagoda, *args.serve_args.split()) if args.pagoda else None
    url = urllib.parse.urlparse(server.url if server else args.url)
    body = json.dumps({"model": "builtin", "prompt": "burst", "max_tokens": args.max_tokens,
                       "stream": True, "ignore_eos": True}).encode()
    try:
        burst(url.hostname, url.port, 4, body)  # warm-up
        time.sleep(0.5)
        before = listen_overflows()
        ttfts, failed = [], 0
        for _ in range(args.rounds):
            out = burst(url.hostname, url.port, args.connections, body)
            ttfts += [t for t in out if t is not None]
            failed += sum(t is None for t in out)
            time.sleep(0.5)  # the previous round's connections close
        after = listen_overflows()
    finally:
        if server:
            server.stop()
    res = {"rounds": args.rounds, "connections": args.connections, "requests": len(ttfts) + failed,
           "failed": failed,
           "ttft_p50_ms": 1e3 * percentile(ttfts, 50) if ttfts else None,
           "ttft_p99_ms": 1e3 * percentile(ttfts, 99) if ttfts else None,
           "ttft_max_ms": 1e3 * max(ttfts) if ttfts else None,
           "over_1s": sum(t > 1.0 for t in ttfts),
           "listen_overflows": None if before is None or after is None else after - before}
    print(json.dumps(res))
    print(f"| {args.connections} x {args.rounds} | {res['ttft_p50_ms']:.1f} / {res['ttft_p99_ms']:.1f} "
          f"/ {res['ttft_max_ms']:.1f} | {res['over_1s']} | {res['listen_overflows']} | {failed} |")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
