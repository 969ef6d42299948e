#!/usr/bin/env python3
"""Checks `pagoda generate` against Hugging Face transformers on small random Llama models.

For each variant (plain, llama3 rope scaling + tied embeddings, sharded bf16 checkpoint) it builds
a LlamaForCausalLM with random weights, saves it with save_pretrained (safetensors), runs
`pagoda generate --json --dump-logits` greedily on several prompts and compares, per prompt:
  * the greedy tokens (a difference is accepted only at a near tie of the HF logits), and
  * the logits of every generated step (max |pagoda - HF|).
transformers runs in fp32 on the CPU (for bf16 checkpoints: bf16 weights upcast to fp32).

Exit status: 0 all match, 1 a mismatch, 3 transformers/torch missing (reported, nothing run).
Usage: hf_check.py --pagoda build/pagoda [--backend NAME] [--page-size P] [--max-new-tokens N]
"""
import argparse
import copy
import json
import math
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as e:  # pragma: no cover - environment dependent
    print(f"hf_check: SKIPPED: {e}. Install torch and transformers (pip install torch "
          f"transformers safetensors) to run this check.")
    sys.exit(3)

NEAR_TIE = 1e-3


def make_model(variant: str, seed: int) -> LlamaForCausalLM:
    cfg = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
               num_attention_heads=4, num_key_value_heads=2, head_dim=64,
               max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-5,
               tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    if variant == "llama3_tied":
        cfg.update(tie_word_embeddings=True, rope_theta=500000.0,
                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 64})
    if variant == "linear_rope":
        cfg.update(rope_scaling={"rope_type": "linear", "factor": 2.0})
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).float().eval()
    # O(1) activations so the greedy choice is not a coin toss between near-equal logits.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]))
    return model


@torch.no_grad()
def hf_greedy(model, prompt, max_new):
    ids = torch.tensor([prompt])
    tokens, logits_all = [], []
    past = None
    inp = ids
    for _ in range(max_new):
        out = model(input_ids=inp, past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
        nxt = int(torch.argmax(logits))
        tokens.append(nxt)
        logits_all.append(logits)
        inp = torch.tensor([[nxt]])
    return tokens, logits_all


def run_pagoda(args, model_dir, prompt):
    cmd = [args.pagoda, "generate", "--model", model_dir, "--token-ids",
           ",".join(map(str, prompt)), "--max-new-tokens", str(args.max_new_tokens), "--json",
           "--dump-logits", "--ignore-eos", "--page-size", str(args.page_size)]
    if args.backend:
        cmd += ["--backend", args.backend]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"pagoda failed ({res.returncode}): {res.stderr.strip()}")
    return json.loads(res.stdout)


def check_variant(args, variant, seed):
    model = make_model(variant, seed)
    ok = True
    with tempfile.TemporaryDirectory() as d:
        if variant == "sharded_bf16":
            # The fp32 reference gets bf16-rounded parameters but keeps its fp32 buffers:
            # Module.to(bf16) would also round the rotary inv_freq buffer and make the HF
            # reference itself wrong.
            ref = copy.deepcopy(model)
            with torch.no_grad():
                for p in ref.parameters():
                    p.copy_(p.to(torch.bfloat16).float())
            model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True,
                                                     max_shard_size="400KB")
            model = ref
        else:
            model.save_pretrained(d, safe_serialization=True)
        gen = torch.Generator().manual_seed(seed + 1)
        prompts = [[1] + torch.randint(3, 512, (n,), generator=gen).tolist()
                   for n in (4, 17, 40, 97, 150)]
        for i, prompt in enumerate(prompts):
            ref_tokens, ref_logits = hf_greedy(model, prompt, args.max_new_tokens)
            out = run_pagoda(args, d, prompt)
            got = out["output_token_ids"]
            logits = out.get("logits", [])
            n = min(len(got), len(ref_tokens))
            max_diff = 0.0
            status = "ok"
            for s in range(n):
                pl = torch.tensor(logits[s])
                max_diff = max(max_diff, float((pl - ref_logits[s]).abs().max()))
                if got[s] != ref_tokens[s]:
                    top2 = torch.topk(ref_logits[s], 2).values
                    margin = float(top2[0] - top2[1])
                    if margin < NEAR_TIE:
                        status = f"near tie at step {s} (margin {margin:.1e}), compared up to it"
                    else:
                        status = (f"MISMATCH at step {s}: pagoda {got[s]} vs HF {ref_tokens[s]} "
                                  f"(margin {margin:.3f})")
                        ok = False
                    break
            if len(got) != len(ref_tokens):
                status += f"; lengths {len(got)} vs {len(ref_tokens)}"
                ok = False
            if max_diff > args.logit_tol:
                status += f"; logits differ by {max_diff:.2e} > {args.logit_tol}"
                ok = False
            print(f"  {variant:>13} prompt {i} (len {len(prompt):3d}): {status}; "
                  f"max |dlogit| {max_diff:.2e}; backend {out['backend']}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pagoda", required=True, help="path to the pagoda binary")
    ap.add_argument("--backend", default="", help="attention backend (default: platform's)")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--logit-tol", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default="plain,llama3_tied,linear_rope,sharded_bf16")
    args = ap.parse_args()
    print(f"hf_check: torch {torch.__version__}, transformers {transformers.__version__}")
    ok = True
    for v in args.variants.split(","):
        ok = check_variant(args, v, args.seed) and ok
    print("hf_check: PASS" if ok else "hf_check: FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
