#!/usr/bin/env python3
"""The CPU model end to end: `pagoda bench` per --cpu-gemm mode vs transformers `generate`.

One request of --input-len random prompt tokens and --output-len greedy tokens on a Hugging Face
checkpoint (e.g. `tools/make_checkpoint.py --layout 1b --dtype bf16 --out /tmp/llama-1b`), at
each thread count: pagoda's decode ms per token and TTFT for every GEMM mode (openblas,
onednn = bf16 weights through oneDNN's matmul, onednn-f32), a mode pagoda refuses on this CPU
recorded with its reason; then, when torch and transformers import, the same prompt through
transformers in bf16 (prefill ms, decode ms per token: (full generate - 1-token generate) /
(output_len - 1), medians of --repeats). Writes cpu_model_vs_torch.md and .json into --out.

Caveats printed with the table: pagoda's TTFT with a oneDNN mode includes packing every weight
matrix once (made on first use); the CLI runs OpenBLAS single-threaded (docs/design/engine.md
§8) while oneDNN and the attention backend use OMP_NUM_THREADS threads.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import time

MODES = ["openblas", "onednn", "onednn-f32"]


def run_pagoda(exe, model, mode, threads, input_len, output_len):
    cmd = [exe, "bench", "--model", model, "--backend", "cpu", "--cpu-gemm", mode, "--requests", "1",
           "--input-len", str(input_len), "--output-len", str(output_len),
           "--pool-tokens", str(max(4096, 2 * (input_len + output_len))), "--json"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        lines = (p.stderr or p.stdout).strip().splitlines()
        return {"refused": lines[-1] if lines else f"exit code {p.returncode}"}
    j = json.loads(p.stdout.strip().splitlines()[-1])
    return {"decode_ms": j["decode_step_ms"], "ttft_ms": j["ttft_p50_ms"],
            "cpu_gemm": j["cpu_gemm"]}


def run_torch(model, threads, input_len, output_len, repeats):
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        return {"refused": f"torch / transformers not importable: {e}"}
    torch.set_num_threads(threads)
    m = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.bfloat16).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, m.config.vocab_size, (1, input_len), generator=g)

    def gen(n):
        with torch.inference_mode():
            t0 = time.perf_counter()
            m.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                       attention_mask=torch.ones_like(ids), pad_token_id=0)
            return (time.perf_counter() - t0) * 1e3

    gen(2)  # warm-up
    prefill = statistics.median(gen(1) for _ in range(repeats))
    full = statistics.median(gen(output_len) for _ in range(repeats))
    return {"prefill_ms": prefill, "decode_ms": (full - prefill) / (output_len - 1),
            "torch": torch.__version__}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--model", required=True, help="a Hugging Face checkpoint folder")
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", nargs="*", type=int, default=[2])
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", nargs="*", default=MODES)
    args = ap.parse_args()
    raw = []
    for t in args.threads:
        row = {"threads": t, "pagoda": {}, "torch": None}
        for mode in args.modes:
            r = run_pagoda(args.pagoda, args.model, mode, t, args.input_len, args.output_len)
            row["pagoda"][mode] = r
            print(f"threads={t} pagoda {mode}: {r}", flush=True)
        row["torch"] = run_torch(args.model, t, args.input_len, args.output_len, args.repeats)
        print(f"threads={t} transformers bf16: {row['torch']}", flush=True)
        raw.append(row)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    lines = [f"# pagoda CPU model vs transformers (bf16), {date}", "",
             f"- CPU: {cpu}; model {args.model}; prompt {args.input_len}, output {args.output_len}",
             "- TTFT with a oneDNN mode includes packing the weights once; OpenBLAS runs one "
             "thread in the CLI, oneDNN OMP_NUM_THREADS", "",
             "| threads | engine | decode ms/token | TTFT / prefill ms |", "|---|---|---|---|"]
    for row in raw:
        for mode, r in row["pagoda"].items():
            if "refused" in r:
                lines.append(f"| {row['threads']} | pagoda {mode} | refused: {r['refused']} | |")
            else:
                lines.append(f"| {row['threads']} | pagoda {mode} | {r['decode_ms']:.1f} | "
                             f"{r['ttft_ms']:.0f} |")
        tr = row["torch"]
        if "refused" in tr:
            lines.append(f"| {row['threads']} | transformers | {tr['refused']} | |")
        else:
            lines.append(f"| {row['threads']} | transformers {tr['torch']} bf16 | "
                         f"{tr['decode_ms']:.1f} | {tr['prefill_ms']:.0f} |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cpu_model_vs_torch.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "cpu_model_vs_torch.json"), "w") as f:
        json.dump({"date": date, "cpu": cpu, "args": vars(args), "rows": raw}, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
