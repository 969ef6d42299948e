#!/usr/bin/env python3
"""Trains a checkpoint written by tools/make_checkpoint.py to continue repeated text, so that
speculative decoding has a workload where answers repeat their prompts (editing, retrieval)
without downloading real weights (the device cannot reach a model hub).

    python3 tools/train_copy_model.py --src /tmp/llama-1b --out /tmp/llama-1b-copy --steps 300

Task: sequences of a random span of tokens (ids below --id-range, as `pagoda bench --workload
repeat` draws them; span length 16..--max-span) repeated until --seq-len; the loss is taken on
every token after the first copy of the span (the predictable part). The model keeps its layout
(config, tokenizer and tied embeddings untouched); the weights are trained in f32 with bf16
autocast and saved in bf16 with save_pretrained. Prints the loss every 25 steps and, at the end,
the greedy copy accuracy on held-out sequences (teacher-forced next-token argmax on the
repeated part) — the evidence that the model copies. Needs torch (CUDA) and transformers.
"""

import argparse
import shutil
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def batch(gen, n, seq_len, max_span, id_range, device):
    x = torch.empty(n, seq_len, dtype=torch.long)
    mask = torch.zeros(n, seq_len, dtype=torch.bool)
    for i in range(n):
        span = int(torch.randint(16, max_span + 1, (1,), generator=gen))
        s = torch.randint(0, id_range, (span,), generator=gen)
        reps = (seq_len + span - 1) // span
        x[i] = s.repeat(reps)[:seq_len]
        mask[i, span:] = True
    return x.to(device), mask.to(device)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--max-span", type=int, default=200)
    ap.add_argument("--id-range", type=int, default=32000)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    dev = "cuda"
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    model = AutoModelForCausalLM.from_pretrained(a.src, dtype=torch.float32).to(dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warm = max(1, a.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * max(0.1, 1.0 - s / a.steps))
    t0 = time.time()
    for step in range(a.steps):
        x, m = batch(gen, a.batch, a.seq_len, a.max_span, a.id_range, dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits[:, :-1].float()
        tgt = x[:, 1:]
        lm = m[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits[lm], tgt[lm])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 25 == 0 or step == a.steps - 1:
            print(f"step {step} loss {loss.item():.4f} ({time.time() - t0:.1f} s)", flush=True)
    model.eval()
    vgen = torch.Generator().manual_seed(a.seed + 1)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        x, m = batch(vgen, 16, a.seq_len, a.max_span, a.id_range, dev)
        pred = model(input_ids=x).logits[:, :-1].argmax(-1)
        acc = (pred == x[:, 1:])[m[:, 1:]].float().mean().item()
    print(f"held-out copy accuracy {acc:.4f} (teacher-forced argmax on the repeated part)")
    model.to(torch.bfloat16).save_pretrained(a.out, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "generation_config.json"):
        try:
            shutil.copy(f"{a.src}/{f}", f"{a.out}/{f}")
        except FileNotFoundError:
            pass
    return 0 if acc > 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
