#!/usr/bin/env python3
"""The engine on a model whose weights copy: tools/make_copy_model.py constructs a two-layer
induction circuit (Llama layout, llama3 RoPE scaling, GQA), so the right output is known without
running any model: greedy decoding must continue a span that already occurred in the prompt.

  1. `pagoda generate` on each CPU backend and page size: a prompt of a span of distinct random ids
     followed by a prefix of its copy (about 2,600 positions, many pages). The output must be
     exactly the rest of the copy, then the span again. The previous-token heads single out
     distance 1 through the high-frequency RoPE pairs, so wrong positions or a wrong rope_theta
     break the copy (checked by hand: rope_theta 10,000 instead of 500,000 fails at output 30);
     the matching heads tolerate small errors in the low-frequency pairs (dropping the llama3
     scaling is not caught here: the model tests compare RoPE itself).
  2. `pagoda bench --spec ngram --workload repeat`, with --tp 1 and 2: greedy outputs with
     speculation identical to those without, no leaked page, and prompt lookup accepting most
     drafts (mean accept length >= 3 of 5), which it can only do if the model really copies.

    check_copy_model.py --pagoda build/pagoda [--seed N]

Needs numpy and safetensors (scripts/setup.sh installs them). Prints the seed.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 4096,
    "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
    "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "bos_token_id": 4000, "eos_token_id": 4001, "hidden_act": "silu", "attention_bias": False,
    "mlp_bias": False, "torch_dtype": "float32",
}


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print("$", " ".join(cmd), "\n", p.stdout[-3000:], p.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"command failed with rc {p.returncode}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 30)
    print(f"seed {seed}", flush=True)
    rng = random.Random(seed)
    failures = 0
    with tempfile.TemporaryDirectory() as d:
        src, model = os.path.join(d, "src"), os.path.join(d, "copy")
        os.makedirs(src)
        with open(os.path.join(src, "config.json"), "w") as fh:
            json.dump(CONFIG, fh)
        print(run([sys.executable, os.path.join(ROOT, "tools", "make_copy_model.py"), "--src", src,
                   "--out", model, "--max-context", "4096", "--seed", str(seed % 1000),
                   "--check-len", "300", "--id-range", "4000"]).strip(), flush=True)

        # 1. Exact continuation of a long copy.
        span = rng.sample(range(4000), 1500)          # distinct ids: one right answer per step
        cut = rng.randrange(1000, 1400)
        prompt = [CONFIG["bos_token_id"]] + span + span[:cut]
        want = (span[cut:] + span)[:40]
        ids = ",".join(map(str, prompt))
        for backend in ("reference", "cpu"):
            for page in (1, 16):
                out = json.loads(run([a.pagoda, "generate", "--model", model, "--backend", backend,
                                      "--page-size", str(page), "--token-ids", ids,
                                      "--max-new-tokens", str(len(want)), "--json"]))
                got = out["output_token_ids"]
                ok = got == want
                failures += not ok
                first_bad = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), None)
                print(f"generate {backend} page {page}: context {len(prompt)}, "
                      f"{'ok' if ok else f'MISMATCH at output {first_bad}: {got} vs {want}'}",
                      flush=True)

        # 2. Prompt lookup on repeated prompts: lossless, and it pays; also on a target sharded
        #    over two tensor-parallel ranks (threads), whose verify batches and K/V moves reach
        #    both ranks.
        for tp in (1, 2):
            out = json.loads(run([a.pagoda, "bench", "--model", model, "--backend", "cpu", "--json",
                                  "--spec", "ngram", "--spec-steps", "4", "--spec-draft-tokens", "5",
                                  "--workload", "repeat", "--requests", "4", "--input-len", "384",
                                  "--output-len", "48", "--max-running", "2", "--seed", str(seed),
                                  "--tp", str(tp)]))
            accept = out["spec"]["mean_accept_length"]
            ok = (out["identical_outputs"] == out["requests"] and out["leaked_pages"] == 0
                  and accept >= 3.0 and out["tp"] == tp)
            failures += not ok
            print(f"bench --spec ngram --tp {tp}: identical {out['identical_outputs']} of "
                  f"{out['requests']}, leaked {out['leaked_pages']}, mean accept length "
                  f"{accept:.2f} (>= 3): {'ok' if ok else 'FAIL'}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
