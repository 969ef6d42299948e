#!/usr/bin/env python3
"""How evenly the sm90 prefill kernel's persistent schedule spreads a step's work over the SMs,
without a GPU.

Re-computes, for uniform batches (B requests of S query tokens on P cached keys each, causal),
what the planner and the kernel do with them:
  * the planner's work items (backends/cuda/cuda_schedule.cpp build_schedule, no split-KV):
    ROWS packed rows (G q heads per kv head, token-major) per item, each weighing the 128-key
    tiles its last row sees, sorted heaviest first (stable: request order within a weight);
  * the kernel's kItemSnake unit order (prefill_sm90_kernel.cuh sm90_unit): unit u = item u / Hkv,
    kv head u % Hkv; round r of g = min(SMS, units) blocks gives block k unit r g + k (r even) or
    r g + g - 1 - k (r odd);
and prints, per shape, each block's load (tiles, plus OVERHEAD tiles per unit for a unit's
fixed cost) as max / mean: the step's time over a perfectly even spread, if every tile took the
same time. Beside it the same units spread by LPT (each unit, heaviest first, to the least
loaded block so far), which a per-block unit list from the host could give the kernel.

usage: sm90_schedule_sim.py [--sms 132] [--rows 128] [--groups 4] [--kv-heads 8]
                            [--overhead 0] [B:S[:P] ...]   (default: the bench shapes)"""
import argparse
import heapq
import math


def item_weights(bs: int, qo: int, prefix: int, group: int, rows: int) -> list[int]:
    """The planner's items, heaviest first: 128-key tiles seen by the item's last row."""
    items = []
    for b in range(bs):
        packed = qo * group
        for t in range(math.ceil(packed / rows)):
            last_tok = (min(packed, (t + 1) * rows) - 1) // group
            items.append((math.ceil((prefix + last_tok + 1) / 128), b))
    items.sort(key=lambda x: (-x[0], x[1]))
    return [w for w, _ in items]


def snake_loads(units: list[float], g: int) -> list[float]:
    load = [0.0] * g
    for u, w in enumerate(units):
        r, k = divmod(u, g)
        load[k if r % 2 == 0 else g - 1 - k] += w
    return load


def lpt_max(units: list[float], g: int) -> float:
    heap = [(0.0, i) for i in range(g)]
    for w in units:  # already heaviest first
        t, i = heapq.heappop(heap)
        heapq.heappush(heap, (t + w, i))
    return max(t for t, _ in heap)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--rows", type=int, default=128, help="packed rows per item (192 at D 64)")
    ap.add_argument("--groups", type=int, default=4, help="q heads per kv head")
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--overhead", type=float, default=0.0, help="tiles of fixed cost per unit")
    ap.add_argument("shapes", nargs="*", default=["4:4096", "1:16384", "16:1024", "1:4096",
                                                   "4:512:8192", "16:64:4096", "8:2048",
                                                   "32:512", "64:256"])
    a = ap.parse_args()
    print(f"{a.sms} SMs, {a.rows} rows per item, G {a.groups}, {a.kv_heads} kv heads, "
          f"{a.overhead} tiles per unit; load = tiles (+ overhead) per block, max / mean")
    print("| B | S | prefix | units | mean load | snake max / mean | LPT max / mean |")
    print("|---|---|---|---|---|---|---|")
    for shape in a.shapes:
        parts = [int(x) for x in shape.split(":")]
        bs, qo, prefix = parts[0], parts[1], parts[2] if len(parts) > 2 else 0
        items = item_weights(bs, qo, prefix, a.groups, a.rows)
        units = [w + a.overhead for w in items for _ in range(a.kv_heads)]
        g = min(a.sms, len(units))
        mean = sum(units) / g
        snake = max(snake_loads(units, g)) / mean
        print(f"| {bs} | {qo} | {prefix} | {len(units)} | {mean:.1f} | {snake:.3f} | "
              f"{lpt_max(units, g) / mean:.3f} |")


if __name__ == "__main__":
    main()
