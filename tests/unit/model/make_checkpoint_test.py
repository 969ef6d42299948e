#!/usr/bin/env python3
"""CTest: tools/make_checkpoint.py writes checkpoints pagoda loads, and pagoda's logits on them
match transformers' (f32, greedy, tiny / qwen2-tiny / mistral-tiny / gemma2-tiny / gemma3-tiny
layouts).

Skipped (exit 77, CTest SKIP_RETURN_CODE) when torch, transformers or tokenizers cannot be
imported: they are too big to install on CI, so nothing is installed here. CTest runs it with
the Python that CMake's PAGODA_TORCH_PYTHON names (configure with a Python that has them).

    make_checkpoint_test.py --pagoda build/src/pagoda/cli/pagoda --tool tools/make_checkpoint.py
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

SKIP = 77
LAYOUTS = ["tiny", "qwen2-tiny", "mistral-tiny", "gemma2-tiny", "gemma3-tiny"]
# 40 tokens: longer than the 32-token windows of mistral-tiny and the Gemma layouts.
PROMPT = [(i * 2654435761 + 7) % 3990 for i in range(40)]
NEW_TOKENS = 4


def perturbed_reference(model, layout, seq):
    """transformers' logits with the family's feature switched off (q/k/v biases zeroed, or the
    sliding window removed), or None: pagoda must be far from these, so that the comparison
    is known to see the feature."""
    import torch

    if layout == "qwen2-tiny":
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.data.zero_()
    elif layout == "mistral-tiny":
        model.config.sliding_window = None
        for layer in model.model.layers:
            if hasattr(layer.self_attn, "sliding_window"):
                layer.self_attn.sliding_window = None
    else:
        return None
    with torch.no_grad():
        return model(seq).logits[0, len(PROMPT) - 1:].double()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--tool", required=True)
    args = ap.parse_args()

    try:
        import tokenizers  # noqa: F401
        import torch
        import transformers
    except ImportError as e:
        print(f"SKIP: {e.name} is not importable by {sys.executable} ({e}); torch + "
              "transformers + tokenizers are too big for CI, so this test installs nothing. "
              "Configure with -DPAGODA_TORCH_PYTHON=<a Python that has them> to run it.")
        return SKIP
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")

    failures = 0
    with tempfile.TemporaryDirectory(prefix="pagoda_ckpt_") as tmp:
        for layout in LAYOUTS:
            out = os.path.join(tmp, layout)
            subprocess.run([sys.executable, args.tool, "--layout", layout, "--dtype", "f32",
                            "--seed", "3", "--out", out, "--threads", "2"], check=True)
            res = subprocess.run(
                # The CPU platform in f32, as transformers runs here: a CUDA build on a GPU
                # machine would otherwise pick the cuda backend in bf16 (~1e-2 off).
                [args.pagoda, "generate", "--backend", "cpu", "--model", out, "--token-ids",
                 ",".join(map(str, PROMPT)), "--max-new-tokens", str(NEW_TOKENS),
                 "--ignore-eos", "--json", "--dump-logits"],
                capture_output=True, text=True)
            if res.returncode != 0:
                print(f"FAIL {layout}: pagoda generate exited {res.returncode}\n{res.stderr}")
                failures += 1
                continue
            got = json.loads(res.stdout.strip().splitlines()[-1])
            ids = got["output_token_ids"]
            assert len(ids) == NEW_TOKENS, got
            # transformers on the same checkpoint and the same tokens: the logits of each step.
            model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32) \
                if int(transformers.__version__.split(".")[0]) >= 5 else \
                transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32)
            model.eval()
            with torch.no_grad():
                seq = torch.tensor([PROMPT + ids[:-1]])
                ref = model(seq).logits[0, len(PROMPT) - 1:].double()
            if "logits" not in got:
                print(f"note {layout}: pagoda generate printed no logits; compared tokens only")
                want = ref.argmax(-1).tolist()
                ok = want == ids
                worst = float("nan")
            else:
                mine = torch.tensor(got["logits"], dtype=torch.float64)
                worst = (mine - ref).abs().max().item()
                scale = ref.abs().max().item()
                tol = 1e-4 + 1e-4 * scale
                ok = worst <= tol
                off = perturbed_reference(model, layout, seq)
                if off is not None:
                    gap = (mine - off).abs().max().item()
                    print(f"   {layout}: without the family's feature transformers differs by "
                          f"{gap:.2e} (must be > 100 x tolerance {tol:.1e})")
                    ok = ok and gap > 100 * tol
            print(f"{'ok' if ok else 'FAIL'} {layout}: tokens {ids}, max |logit diff| vs "
                  f"transformers {worst:.2e} (logits up to {ref.abs().max().item():.2e})")
            failures += 0 if ok else 1
    print(f"{len(LAYOUTS) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
