#!/usr/bin/env python3
"""The CPU model end to end: `pagoda bench` per --cpu-gemm mode vs transformers `generate`, both
serving the same batch of N prompts (issue 51's target: output tok/s >= 3x transformers bf16).

For each thread count (default 2 and every core) and each batch size N (--requests, default 1
and 8): N prompts of --input-len random tokens, --output-len greedy tokens each (EOS ignored on
both sides), on a Hugging Face checkpoint (e.g. `tools/make_checkpoint.py --layout 1b --dtype
bf16 --out /tmp/llama-1b`).
- pagoda: `pagoda bench --requests N` (all N submitted at once, continuous batching) per GEMM
  mode (default amx = bf16 weights on pagoda's AMX GEMM, onednn = bf16 weights through oneDNN's
  matmul, and openblas): output tok/s (all output tokens / the serving wall time, load
  excluded), decode ms per step (a step decodes the
  whole batch), TTFT p50, and load s (checkpoint read + weights packed; no request pays for
  packing). A mode pagoda refuses on this CPU is recorded with its reason.
- transformers (when torch and transformers import), bf16: the N prompts in one batch, left
  padded with an attention_mask (the tokenizer's convention for batched generate; the prompts
  have equal lengths, so nothing is padded), `generate(max_new_tokens = min_new_tokens =
  output_len)`: prefill ms = a 1-token generate, decode ms per step = (full - prefill) /
  (output_len - 1), output tok/s = N * output_len / full; medians of --repeats.

Rows run in order (threads, then N) until --budget seconds have passed; a row that would start
later is recorded as skipped, so a device stage ends in its time. Writes cpu_model_vs_torch.md
and cpu_model_vs_torch.json (one document: date, cpu, args, rows) into --out.

The CLI runs OpenBLAS single-threaded (docs/design/engine.md §8) while oneDNN and the attention
backend use OMP_NUM_THREADS threads.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import time

MODES = ["amx", "onednn", "openblas"]


def run_pagoda(exe, model, mode, threads, requests, input_len, output_len, timeout):
    cmd = [exe, "bench", "--model", model, "--backend", "cpu", "--cpu-gemm", mode,
           "--requests", str(requests), "--input-len", str(input_len),
           "--output-len", str(output_len),
           "--pool-tokens", str(max(4096, 2 * requests * (input_len + output_len))), "--json"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"refused": f"timed out after {timeout:.0f} s"}
    if p.returncode != 0:
        lines = (p.stderr or p.stdout).strip().splitlines()
        return {"refused": lines[-1] if lines else f"exit code {p.returncode}"}
    j = json.loads(p.stdout.strip().splitlines()[-1])
    return {"output_tok_s": j["output_tokens_per_s"], "decode_ms": j["decode_step_ms"],
            "ttft_ms": j["ttft_p50_ms"], "load_s": j.get("load_s"), "cpu_gemm": j["cpu_gemm"],
            "bf16_weights": j.get("bf16_weights")}


class Torch:
    """transformers' model in bf16, loaded once; generate() timings per thread count and N."""

    def __init__(self, model):
        import torch
        from transformers import AutoModelForCausalLM
        self.torch = torch
        # .to(): the dtype keyword is spelled differently across transformers versions.
        self.m = AutoModelForCausalLM.from_pretrained(model).to(torch.bfloat16).eval()

    def run(self, threads, requests, input_len, output_len, repeats):
        torch = self.torch
        torch.set_num_threads(threads)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, self.m.config.vocab_size, (requests, input_len), generator=g)
        mask = torch.ones_like(ids)  # left padding: equal lengths, so every position counts

        def gen(n):
            with torch.inference_mode():
                t0 = time.perf_counter()
                self.m.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                do_sample=False, pad_token_id=0)
                return (time.perf_counter() - t0) * 1e3

        gen(2)  # warm-up
        prefill = statistics.median(gen(1) for _ in range(repeats))
        full = statistics.median(gen(output_len) for _ in range(repeats))
        return {"output_tok_s": requests * output_len / (full / 1e3), "prefill_ms": prefill,
                "decode_ms": (full - prefill) / (output_len - 1), "torch": torch.__version__}


def write_json(out, doc):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "cpu_model_vs_torch.json"), "w") as f:
        json.dump(doc, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--model", required=True, help="a Hugging Face checkpoint folder")
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", nargs="*", type=int, default=[2, os.cpu_count()])
    ap.add_argument("--requests", nargs="*", type=int, default=[1, 8])
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--modes", nargs="*", default=MODES)
    ap.add_argument("--budget", type=float, default=86400.0,
                    help="seconds: rows that would start later are recorded as skipped")
    args = ap.parse_args()
    start = time.monotonic()
    left = lambda: args.budget - (time.monotonic() - start)  # noqa: E731
    torch_side, torch_why = None, None
    try:
        torch_side = Torch(args.model)
    except ImportError as e:
        torch_why = f"torch / transformers not importable: {e}"
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    rows = []
    for t in dict.fromkeys(args.threads):  # 2 and os.cpu_count() may coincide
        for n in args.requests:
            row = {"threads": t, "requests": n, "pagoda": {}, "torch": None}
            rows.append(row)
            if left() <= 0:
                row["skipped"] = f"the {args.budget:.0f} s budget was spent"
                print(f"threads={t} N={n}: skipped", flush=True)
                continue
            for mode in args.modes:
                r = run_pagoda(args.pagoda, args.model, mode, t, n, args.input_len,
                               args.output_len, max(left(), 1))
                row["pagoda"][mode] = r
                print(f"threads={t} N={n} pagoda {mode}: {r}", flush=True)
            row["torch"] = ({"refused": torch_why} if torch_side is None else
                            torch_side.run(t, n, args.input_len, args.output_len, args.repeats))
            print(f"threads={t} N={n} transformers bf16: {row['torch']}", flush=True)
            # After every row: a run cut short by its caller's timeout keeps the rows it made.
            write_json(args.out, {"date": date, "cpu": cpu, "args": vars(args), "rows": rows})
    doc = {"date": date, "cpu": cpu, "args": vars(args), "rows": rows}
    write_json(args.out, doc)
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tables import cpu_model_table  # one renderer for this file and the device records
    lines = [f"# pagoda CPU model vs transformers (bf16), {date}", "", f"CPU: {cpu}.", ""]
    lines += cpu_model_table(doc)
    with open(os.path.join(args.out, "cpu_model_vs_torch.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
