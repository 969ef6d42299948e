#!/usr/bin/env python3
"""Resident memory of `pagoda serve --model builtin` under large request bodies.

Idle size (after a few small requests), then --count bodies of --size bytes (serve_harness's
large_bodies: a wide object under an unimplemented field, deep nesting, a chat of many tiny
messages, one large string) sent --concurrency at a time; reports the resident size once the
server is idle again, the process's peak, and the answers' statuses.

    python3 bench/serve_memory.py --pagoda build/pagoda [--count 30 --concurrency 1]
"""
import argparse
import collections
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "unit" / "server"))
from serve_harness import Server, large_body_memory  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--size", type=int, default=8_000_000)
    ap.add_argument("--count", type=int, default=30)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--serve-args", default="")
    args = ap.parse_args()
    with Server(args.pagoda, *args.serve_args.split()) as s:
        for _ in range(4):
            s.post("/v1/completions", {"model": "builtin", "prompt": "warm up", "max_tokens": 8})
        m = large_body_memory(s, {}, args.size, args.count, args.concurrency)
    mb = 1 << 20
    res = {"size": args.size, "count": args.count, "concurrency": args.concurrency,
           "idle_mb": round(m["idle"] / mb, 1), "after_mb": round(m["after"] / mb, 1),
           "growth_mb": round((m["after"] - m["idle"]) / mb, 1), "peak_mb": round(m["peak"] / mb, 1),
           "statuses": dict(collections.Counter(m["statuses"]))}
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
