#!/usr/bin/env python3
"""Per-round ratios of FlashInfer to pagoda from interleaved rounds of one device call.

Usage: peer_rounds.py DIR [OUT.md]
DIR holds ours_r<k>.jsonl (pagoda_cuda_bench: {"case", "ms", "flops", ...}) and
flashinfer_r<k>.jsonl (bench/cuda/flashinfer_peer.py: {"case", "fa3_ms", ["fa3_ragged_ms"]})
for rounds k = 1, 2, ..., written alternately (ours, then FlashInfer, per round) by
scripts/h200_mla_prefill.sh STAGE=B with PEER_ROUNDS. A single pair per call cannot tell the
peer's call-to-call spread from a change (FlashInfer's fa3 B4 S4096 ran 1.148 ms in one call
and 1.061 in the next at the same code); rounds in one call give each case's ratio per round,
and the median of the ratios is the number to quote. Prints (and writes to OUT.md) one row per
case: ours and fa3 per round (ms), the per-round ratios fa3 / ours (> 1 = pagoda faster), and
the median ratio. Cases FlashInfer refused in every round show "refused"."""
import json
import os
import re
import statistics
import sys


def load(path: str) -> dict[str, dict]:
    out = {}
    with open(path) as f:
        for line in f:
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if isinstance(j, dict) and "case" in j:
                out[j["case"]] = j
    return out


def rounds(d: str, stem: str) -> list[dict[str, dict]]:
    found = {}
    for name in os.listdir(d):
        m = re.fullmatch(stem + r"_r(\d+)\.jsonl", name)
        if m:
            found[int(m.group(1))] = load(os.path.join(d, name))
    return [found[k] for k in sorted(found)]


def peer_ms(rec: dict) -> tuple[float | None, str]:
    if rec.get("fa3_ms") is not None:
        return rec["fa3_ms"], ""
    if rec.get("fa3_ragged_ms") is not None:
        return rec["fa3_ragged_ms"], " (ragged)"
    return None, ""


def table(d: str) -> str:
    ours, fi = rounds(d, "ours"), rounds(d, "flashinfer")
    n = min(len(ours), len(fi))
    if n == 0:
        return "no ours_r<k>.jsonl / flashinfer_r<k>.jsonl pairs in " + d + "\n"
    ours, fi = ours[:n], fi[:n]
    lines = [f"{n} interleaved rounds (ours, then FlashInfer fa3, per round); ratio = fa3 / ours "
             "(> 1 = pagoda faster)", "",
             "| case | ours ms per round | fa3 ms per round | ratio per round | median ratio |",
             "|---|---|---|---|---|"]
    for case in ours[0]:
        if case not in fi[0] or "ms" not in ours[0][case]:
            continue
        o = [r[case]["ms"] if case in r else None for r in ours]
        p, tag = [], ""
        for r in fi:
            ms, t = peer_ms(r.get(case, {}))
            p.append(ms)
            tag = tag or t
        ratios = [b / a for a, b in zip(o, p) if a and b]
        fmt = lambda xs: " / ".join("–" if x is None else f"{x:.4f}" for x in xs)  # noqa: E731
        if not ratios:
            lines.append(f"| {case} | {fmt(o)} | refused | – | – |")
            continue
        lines.append(f"| {case} | {fmt(o)} | {fmt(p)}{tag} | "
                     f"{' / '.join(f'{x:.3f}' for x in ratios)} | "
                     f"**{statistics.median(ratios):.3f}** |")
    return "\n".join(lines) + "\n"


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    text = table(sys.argv[1])
    print(text, end="")
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
