#!/usr/bin/env python3
"""The engine on real checkpoint layouts against the roofline and against `transformers`, in one
run on one GPU (issue "Engine for real models"; results in bench/results/engine_real_h200.md).

    python3 bench/engine_real.py --pagoda build/pagoda --out DIR [--layouts 1b,8b]

For each layout it writes a random bf16 checkpoint (tools/make_checkpoint.py), then measures, all
in this process's run:
  * the ceilings: device-to-device copy bandwidth (bytes read + written) and the bf16 GEMM rate
    (8192^3 torch.matmul), each the best of several timed repeats after warm-up;
  * pagoda single stream (`pagoda bench --requests 1 --max-running 1`) and 64 concurrent requests:
    decode step time and output tok/s, against the step roofline
        (weight bytes + KV bytes read per step) / copy bandwidth;
  * pagoda prefill of a 2,048-token prompt: TTFT and FLOP/s against the GEMM rate (MLA layouts:
    also with --mla-prefill absorbed, the other extend form, in the same run);
  * `transformers` bf16 `generate` at batch 1 and 64 on the same prompt and output lengths
    (greedy, min_new_tokens = max_new_tokens so both produce every token);
  * agreement: pagoda bf16 first generated token vs `transformers` fp32 on 20 prompts, and the
    max |logit| difference of the first step.
Raw outputs go to DIR (bench_*.json, peer_*.json, summary.json) and a Markdown table to stdout.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def ceilings():
    dev = torch.device("cuda")
    n = 1 << 30  # 2 GiB of bf16 each way
    src = torch.empty(n, dtype=torch.bfloat16, device=dev).normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        torch.cuda.synchronize()
        best = min(best, s.elapsed_time(e) / 1e3)
    copy_bw = 2 * n * 2 / best
    del src, dst
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        torch.cuda.synchronize()
        best = min(best, s.elapsed_time(e) / 1e3)
    gemm = 2 * 8192**3 / best
    del a, b
    torch.cuda.empty_cache()
    return copy_bw, gemm


def run_json(cmd, out_path):
    log("$", " ".join(cmd))
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    log(f"  ({time.time() - t0:.1f} s, rc {p.returncode})")
    if p.returncode != 0:
        log(p.stdout[-4000:], p.stderr[-4000:])
        raise SystemExit(f"failed: {' '.join(cmd)}")
    with open(out_path, "w") as f:
        f.write(p.stdout)
    return json.loads(p.stdout.strip().splitlines()[-1])


def pagoda_bench(args, ckpt, name, requests, max_running, input_len, output_len, extra=(),
                 chunk=0):
    cmd = [args.pagoda, "bench", "--model", ckpt, "--backend", "cuda", "--json",
           "--requests", str(requests), "--max-running", str(max_running),
           "--input-len", str(input_len), "--output-len", str(output_len),
           "--pool-tokens", str(max(65536, requests * (input_len + output_len) * 2)),
           "--chunk-size", str(chunk), "--page-size", "16", *extra]
    return run_json(cmd, os.path.join(args.out, f"bench_{name}.json"))


def checkpoint_weight_bytes(ckpt, cfg):
    """Bytes of the checkpoint's tensors a decode step reads: all of them (from the
    safetensors headers) but the input embedding, plus that matrix again when the LM head is
    tied to it."""
    total, embed = 0, 0
    for name in sorted(os.listdir(ckpt)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(ckpt, name), "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        for key, t in header.items():
            if key == "__metadata__":
                continue
            size = t["data_offsets"][1] - t["data_offsets"][0]
            total += size
            if key.endswith("embed_tokens.weight"):
                embed += size
    return total - embed + (embed if cfg.get("tie_word_embeddings") else 0)


def prompts(n, length, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, min(vocab, 100000), (n, length), generator=g).tolist()


def hf_generate(ckpt, dtype, batch, input_len, output_len, seed):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype).cuda().eval()
    ids = torch.tensor(prompts(batch, input_len, model.config.vocab_size, seed), device="cuda")
    attn = torch.ones_like(ids)
    kw = dict(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False,
              attention_mask=attn, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, **dict(kw, max_new_tokens=4, min_new_tokens=4))  # warm-up
        torch.cuda.synchronize()
        t0 = time.time()
        out = model.generate(ids, **kw)
        torch.cuda.synchronize()
        wall = time.time() - t0
    new = out.shape[1] - input_len
    del model
    torch.cuda.empty_cache()
    return {"batch": batch, "input_len": input_len, "output_len": new, "wall_s": wall,
            "output_tokens_per_s": batch * new / wall}


def load_fp32(ckpt, device):
    """The checkpoint in transformers, fp32, on `device`, for inference."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).to(device).eval()


def agreement(pagoda, ckpt, out, n=20, length=32, device="cuda", backend="cuda", model=None):
    """pagoda's first generated token (its default dtype on `backend`: bf16 on cuda, f32 on the
    cpu) against `transformers` fp32 on `device`, on n random prompts of `length` ids. `model`:
    the checkpoint already loaded by load_fp32 (kept for the caller), else loaded and freed
    here."""
    own = model is None
    if own:
        model = load_fp32(ckpt, device)
    ps = prompts(n, length, model.config.vocab_size, 1234)
    with torch.no_grad():  # one prompt at a time: the hybrids' torch scan fallback is large
        logits = torch.cat([model(torch.tensor([p], device=device)).logits[:, -1, :].float().cpu()
                            for p in ps])
    if own:
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    batch_file = os.path.join(out, "agree_prompts.txt")
    with open(batch_file, "w") as f:
        for p in ps:
            f.write(",".join(map(str, p)) + "\n")
    cmd = [pagoda, "generate", "--model", ckpt, "--backend", backend, "--batch-file",
           batch_file, "--max-new-tokens", "1", "--json", "--dump-logits"]
    log("$", " ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        log(p.stdout[-4000:], p.stderr[-4000:])
        raise SystemExit("pagoda generate --batch-file failed")
    rows = [json.loads(line) for line in p.stdout.strip().splitlines()]
    agree, max_diff, max_abs = 0, 0.0, 0.0
    for i, r in enumerate(rows):
        ref = logits[i]
        agree += int(r["output_token_ids"][0] == int(ref.argmax()))
        ours = torch.tensor(r["logits"][0])
        max_diff = max(max_diff, float((ours - ref).abs().max()))
        max_abs = max(max_abs, float(ref.abs().max()))
    return {"prompts": n, "first_token_agree": agree, "max_abs_logit_diff": max_diff,
            "max_abs_logit": max_abs}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layouts", default="1b")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--single-only", default="",
                    help="layouts (comma separated) measured at batch 1 only (pagoda and the "
                         "transformers peer), e.g. 8b to keep the run short")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    copy_bw, gemm = ceilings()
    log(f"copy {copy_bw / 1e12:.2f} TB/s, bf16 GEMM {gemm / 1e12:.0f} TFLOP/s")
    summary = {"copy_bytes_per_s": copy_bw, "gemm_flops": gemm, "layouts": {}}
    for layout in args.layouts.split(","):
        ckpt = f"/tmp/ckpt-{layout}"
        if not os.path.exists(os.path.join(ckpt, "config.json")):
            subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_checkpoint.py"),
                            "--layout", layout, "--dtype", "bf16", "--out", ckpt], check=True)
        cfg = json.load(open(os.path.join(ckpt, "config.json")))
        res = {}
        il, ol = args.input_len, args.output_len
        single_only = layout in args.single_only.split(",")
        res["single"] = pagoda_bench(args, ckpt, f"{layout}_b1", 1, 1, il, ol)
        if not single_only:
            res["batch64"] = pagoda_bench(args, ckpt, f"{layout}_b64", 64, 64, il, ol)
            res["prefill2048"] = pagoda_bench(args, ckpt, f"{layout}_prefill", 4, 1, 2048, 1)
            if "kv_lora_rank" in cfg:  # MLA: the absorbed extend form too (--mla-prefill A/B)
                res["prefill2048_absorbed"] = pagoda_bench(
                    args, ckpt, f"{layout}_prefill_absorbed", 4, 1, 2048, 1,
                    ("--mla-prefill", "absorbed"))
                # A 8,192-token prompt in chunks of 1,024: the expanded form over each chunk's
                # prefix in one key window, then in windows of 1,024 keys merged by LSE.
                for name, extra in (("one_window", ()),
                                    ("windows1024", ("--mla-window-keys", "1024"))):
                    res[f"prefill8192_chunked_{name}"] = pagoda_bench(
                        args, ckpt, f"{layout}_prefill8192_{name}", 2, 1, 8192, 1, extra,
                        chunk=1024)
        # Roofline of one decode step: every weight once (the checkpoint's tensors but the
        # embedding, whose few rows are read; the LM head is the tied embedding or its own
        # matrix) + the KV of the batch at its mean context (the pool's bytes per token, from
        # pagoda's own run: MHA K/V or the MLA latent row).
        L = cfg["num_hidden_layers"]
        weight_bytes = checkpoint_weight_bytes(ckpt, cfg)
        mean_ctx = il + ol / 2
        for key, bs in (("single", 1), ("batch64", 64)):
            if key not in res:
                continue
            r = res[key]
            kv_per_token = r["kv_bytes"] / ((r["pages_total"] + 1) * r["page_size"])
            kv_bytes = bs * mean_ctx * kv_per_token
            roof_ms = (weight_bytes + kv_bytes) / copy_bw * 1e3
            r["weight_bytes"] = weight_bytes
            r["kv_bytes_per_token"] = kv_per_token
            r["roofline_step_ms"] = roof_ms
            r["step_over_roofline"] = r["decode_step_ms"] / roof_ms
        pf = res.get("prefill2048", {"extend_step_min_tokens": 2048, "extend_step_min_ms": float("nan")})
        # FLOPs: 2 per weight per token (the head over the one sampled row) + causal attention
        # (QK over the q/k head dim, PV over the value head dim; MLA: the non-absorbed 192 / 128).
        hq = cfg["num_attention_heads"]
        d = cfg.get("head_dim") or cfg["hidden_size"] // hq
        dqk = cfg.get("qk_nope_head_dim", 0) + cfg.get("qk_rope_head_dim", 0) or d
        dv = cfg.get("v_head_dim") or d
        head = cfg["vocab_size"] * cfg["hidden_size"] * 2
        flops = 2 * 2048 * (weight_bytes - head) / 2 + 2 * head / 2 \
            + 2 * 2048 * 2048 / 2 * hq * (dqk + dv) * L
        pf["prefill_flops"] = flops
        assert pf["extend_step_min_tokens"] == 2048, pf
        pf["prefill_tflops"] = flops / (pf["extend_step_min_ms"] / 1e3) / 1e12
        pf["prefill_fraction_of_gemm"] = flops / (pf["extend_step_min_ms"] / 1e3) / gemm
        if not args.skip_peer:
            res["hf_b1"] = hf_generate(ckpt, torch.bfloat16, 1, il, ol, 7)
            if not single_only:
                res["hf_b64"] = hf_generate(ckpt, torch.bfloat16, 64, il, ol, 7)
                res["agreement"] = agreement(args.pagoda, ckpt, args.out)
        summary["layouts"][layout] = res
        json.dump(summary, open(os.path.join(args.out, "summary.json"), "w"), indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
