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

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_real  # noqa: E402  (the agreement measurement itself)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def greedy_agreement(pagoda, ckpt, out, n, length, new, device, backend, model):
    """Greedy continuations of `new` tokens (pagoda's decode path: KV cache, windows, states)
    against transformers fp32 `generate` (`model`, engine_real.load_fp32's) on the same prompts:
    identical sequences, and the mean length of the common prefix."""
    ps = engine_real.prompts(n, length, model.config.vocab_size, 4321)
    ref = []
    with torch.no_grad():
        for p in ps:
            ids = torch.tensor([p], device=device)
            o = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                               min_new_tokens=new, do_sample=False, pad_token_id=0)
            ref.append(o[0, length:].tolist())
    batch_file = os.path.join(out, "greedy_prompts.txt")
    with open(batch_file, "w") as f:
        for p in ps:
            f.write(",".join(map(str, p)) + "\n")
    cmd = [pagoda, "generate", "--model", ckpt, "--backend", backend, "--batch-file", batch_file,
           "--max-new-tokens", str(new), "--ignore-eos", "--json"]
    engine_real.log("$", " ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        engine_real.log(p.stdout[-4000:], p.stderr[-4000:])
        raise SystemExit("pagoda generate --batch-file failed")
    ours = [json.loads(line)["output_token_ids"] for line in p.stdout.strip().splitlines()]
    same, common = 0, 0
    for a, b in zip(ours, ref):
        same += int(a == b)
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        common += k
    return {"greedy_new_tokens": new, "greedy_identical": same,
            "greedy_mean_common_prefix": common / max(len(ref), 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layouts", default="deepseek-v2-tiny,deepseek-v3-tiny")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--length", type=int, default=32, help="prompt ids per prompt")
    ap.add_argument("--greedy", type=int, default=0,
                    help="also compare greedy continuations of this many tokens (0: none)")
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
        model = engine_real.load_fp32(ckpt, args.device)  # once for both comparisons
        res = engine_real.agreement(args.pagoda, ckpt, args.out, n=args.prompts,
                                    length=args.length, device=args.device, backend=backend,
                                    model=model)
        res.update(layout=layout, device=args.device, backend=backend, length=args.length)
        if args.greedy > 0:
            res.update(greedy_agreement(args.pagoda, ckpt, args.out, args.prompts, args.length,
                                        args.greedy, args.device, backend, model))
        del model
        if args.device == "cuda":
            torch.cuda.empty_cache()
        rows.append(res)
        engine_real.log(json.dumps(res))
    record = {"commit": commit, "device": args.device, "rows": rows}
    print(json.dumps(record))
    greedy = args.greedy > 0
    print("| layout | device | prompt ids | first-token agreement | max abs logit diff | "
          "max abs logit |" + (" greedy continuations identical | mean common prefix |"
                               if greedy else ""), file=sys.stderr)
    print("|---|---|---|---|---|---|" + ("---|---|" if greedy else ""), file=sys.stderr)
    for r in rows:
        print(f"| {r['layout']} | {r['device']} | {r['length']} | "
              f"{r['first_token_agree']} / {r['prompts']} | "
              f"{r['max_abs_logit_diff']:.3g} | {r['max_abs_logit']:.3g} |"
              + (f" {r['greedy_identical']} / {r['prompts']} ({r['greedy_new_tokens']} tokens) | "
                 f"{r['greedy_mean_common_prefix']:.1f} |" if greedy else ""), file=sys.stderr)


if __name__ == "__main__":
    main()
