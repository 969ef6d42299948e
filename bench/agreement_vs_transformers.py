#!/usr/bin/env python3
"""pagoda's first generated token against `transformers` fp32 on random checkpoints of the
layouts `transformers` implements (issue 50: DeepSeek-V2 / V3 MLA layouts; any
tools/make_checkpoint.py layout works), on the CPU or the GPU, one JSON record per run.

    python3 bench/agreement_vs_transformers.py --pagoda build/pagoda --out DIR \\
        [--layouts deepseek-v2-tiny,deepseek-v3-tiny] [--device cpu|cuda] [--prompts 20]

For each layout: tools/make_checkpoint.py --seed 0 writes the checkpoint (bf16 weights), then
engine_real.agreement compares pagoda (`generate --dump-logits`, its default dtype on the
backend: f32 on the cpu, bf16 on cuda) with transformers fp32 on 20 prompts of --length random ids:
first-token agreement and the largest |logit| difference. DeepSeek-V3.2 (DSA) has no
transformers model; its reference is the NumPy forward (ctest model_deepseek_numpy).
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_real  # noqa: E402  (the agreement measurement itself)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layouts", default="deepseek-v2-tiny,deepseek-v3-tiny")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--length", type=int, default=32, help="prompt ids per prompt")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    backend = "cuda" if args.device == "cuda" else "cpu"
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    rows = []
    for layout in args.layouts.split(","):
        ckpt = os.path.join(args.out, layout)
        if not os.path.exists(os.path.join(ckpt, "config.json")):
            subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_checkpoint.py"),
                            "--layout", layout, "--seed", "0", "--out", ckpt], check=True)
        res = engine_real.agreement(args.pagoda, ckpt, args.out, n=args.prompts,
                                    length=args.length, device=args.device, backend=backend)
        res.update(layout=layout, device=args.device, backend=backend, length=args.length)
        rows.append(res)
        engine_real.log(json.dumps(res))
    record = {"commit": commit, "device": args.device, "rows": rows}
    print(json.dumps(record))
    print("| layout | device | prompt ids | first-token agreement | max abs logit diff | "
          "max abs logit |", file=sys.stderr)
    print("|---|---|---|---|---|---|", file=sys.stderr)
    for r in rows:
        print(f"| {r['layout']} | {r['device']} | {r['length']} | "
              f"{r['first_token_agree']} / {r['prompts']} | "
              f"{r['max_abs_logit_diff']:.3g} | {r['max_abs_logit']:.3g} |", file=sys.stderr)


if __name__ == "__main__":
    main()
