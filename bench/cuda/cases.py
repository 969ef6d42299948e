#!/usr/bin/env python3
"""The kernel benchmark shapes of bench/cuda/cases.json, for Python (no torch needed).

Usage: cases.py CASES.json --jit-groups
  prints the case names grouped by the FlashInfer kernel module they need (one line of
  comma-separated names per module: decode, absorbed-MLA decode, or prefill, by head dims and KV
  type), so bench/device/run.sh can have FlashInfer compile the modules in parallel."""
import json
import sys


def load_cases(path):
    """Every case with the file's "defaults" filled in."""
    doc = json.load(open(path))
    return [{**doc["defaults"], **c} for c in doc["cases"]]


def kind(c):
    """decode, mla_decode (absorbed latent), tree (verify mask), prefill (no prefix) or extend."""
    if c["latent"]:
        return "mla_decode"
    if c["qo"] == 1:
        return "decode"
    if c["tree"]:
        return "tree"
    return "prefill" if c["prefix"] == 0 else "extend"


def jit_groups(cases):
    groups = {}
    for c in cases:
        k = kind(c)
        key = (k if k in ("decode", "mla_decode") else "prefill", c["d"], c["dv"], c["kv"])
        groups.setdefault(key, []).append(c["name"])
    return list(groups.values())


def main():
    if len(sys.argv) != 3 or sys.argv[2] != "--jit-groups":
        print(__doc__)
        return 2
    for names in jit_groups(load_cases(sys.argv[1])):
        print(",".join(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
