"""Shared by the NumPy forward checks (check_gemma_numpy.py, check_deepseek_numpy.py): running
`pagoda generate --json` and comparing a request's dumped logits with a float64 reference."""

import argparse
import importlib.util
import json
import random
import subprocess
import sys

import numpy as np

TOL = 1e-5


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print("$", " ".join(cmd), "\n", p.stdout[-3000:], p.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"command failed with rc {p.returncode}")
    return [json.loads(line) for line in p.stdout.strip().splitlines()]


def setup():
    """Parses --pagoda, --tool (tools/make_checkpoint.py, loaded as a module) and --seed (drawn
    when absent; printed); returns (args, the tool module, a numpy Generator of the seed)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--tool", required=True, help="tools/make_checkpoint.py")
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 30)
    print(f"seed {seed}", flush=True)
    spec = importlib.util.spec_from_file_location("make_checkpoint", a.tool)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return a, tool, np.random.default_rng(seed)


def refused(cmd, needle, label):
    """Runs cmd, which must fail with `needle` in its output; prints; returns failures (0 / 1)."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    msg = (p.stdout + p.stderr).strip()
    ok = p.returncode != 0 and needle in msg
    print(f"{'ok' if ok else 'FAIL'} {label} refused naming {needle}: {msg[-160:]}")
    return int(not ok)


def check(forward, cfg, w, prompt, got, label, features):
    """Compares one request's output with forward(cfg, w, ids, off) (logits [T, vocab],
    teacher-forced on pagoda's tokens; `off` switches a feature off); returns the number of
    failures (0 or 1)."""
    ids, steps = got["output_token_ids"], got["logits"]
    seq = prompt + ids[:-1]
    ref = forward(cfg, w, seq)[len(prompt) - 1:]
    mine = np.array(steps, dtype=np.float64)
    worst = float(np.abs(mine - ref).max())
    tol = TOL * max(1.0, float(np.abs(ref).max()))
    bad = worst > tol
    for i, tok in enumerate(ids):
        top2 = np.sort(ref[i])[-2:]
        if top2[1] - top2[0] > 10 * tol and tok != int(np.argmax(ref[i])):
            print(f"  {label}: step {i} token {tok} but the reference's argmax is "
                  f"{int(np.argmax(ref[i]))}")
            bad = True
    gaps = []
    for f in features:
        gap = float(np.abs(mine - forward(cfg, w, seq, frozenset([f]))[len(prompt) - 1:]).max())
        gaps.append(f"{f} {gap:.1e}")
        if gap <= 100 * tol:
            print(f"  {label}: without {f} the reference moves only {gap:.1e} (<= 100 x {tol:.0e})")
            bad = True
    print(f"{'FAIL' if bad else 'ok'} {label}: tokens {ids}, max |logit diff| {worst:.1e} "
          f"(tol {tol:.0e}); without a feature: {', '.join(gaps) if gaps else '-'}", flush=True)
    return int(bad)
