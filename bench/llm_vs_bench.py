#!/usr/bin/env python3
"""pagoda.LLM.generate throughput against `pagoda bench` on the same fixed workload.

    PYTHONPATH=build/python python3 bench/llm_vs_bench.py --pagoda build/pagoda \\
        [--model builtin] [--backend B] [--input-len 512] [--output-len 128] [--requests 64]
        [--rounds 5] [--json OUT]

`pagoda bench --input-len L --output-len M --requests R` queues R random prompts of L tokens, each
generating exactly M tokens (greedy, EOS ignored), and reports output tokens/s over the run. This
script does the same through pagoda.LLM (a fresh engine per round, as the CLI's fresh process;
generate() timed, then timed again warm) with the same page size, pool, running-request limit
and backend, alternating the two for --rounds rounds, and prints the median output tokens/s of
each, their spread and the ratio LLM / bench of the fresh-engine runs (target: within 5 %).
"""
import argparse
import gc
import json
import statistics
import subprocess
import time

import numpy as np

import pagoda


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--model", default="builtin")
    ap.add_argument("--backend", default="")
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--pool-tokens", type=int, default=0, help="0: room for every request")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None, help="write the samples and medians to this file")
    a = ap.parse_args()
    pool = a.pool_tokens or a.requests * (a.input_len + a.output_len + 2 * a.page_size)
    cli = [a.pagoda, "bench", "--model", a.model, "--input-len", str(a.input_len),
           "--output-len", str(a.output_len), "--requests", str(a.requests), "--max-running",
           str(a.requests), "--page-size", str(a.page_size), "--pool-tokens", str(pool),
           "--seed", str(a.seed), "--json"] + (["--backend", a.backend] if a.backend else [])
    def make_llm():
        return pagoda.LLM(a.model, backend=a.backend or None, page_size=a.page_size,
                          pool_tokens=pool, max_num_seqs=a.requests)

    rng = np.random.default_rng(a.seed)
    params = pagoda.SamplingParams(temperature=0, max_tokens=a.output_len, ignore_eos=True)
    # "llm": the first generate() of a freshly built engine, as `pagoda bench` times the first
    # (and only) workload of its process (model load and graph capture untimed on both sides);
    # "llm_warm": a second generate() on that engine (first-use costs paid), for information.
    rates = {"bench": [], "llm": [], "llm_warm": []}
    backend = None
    for r in range(a.rounds):
        for name in (("bench", "llm") if r % 2 == 0 else ("llm", "bench")):
            if name == "bench":
                out = json.loads(subprocess.run(cli, check=True, capture_output=True,
                                                text=True).stdout)
                rates["bench"].append(out["output_tokens_per_s"])
                continue
            llm = make_llm()
            backend, vocab = llm.backend, llm._engine.vocab_size
            for key in ("llm", "llm_warm"):
                # fresh prompts each time: no prefix-cache hits, as in the CLI's workload
                batch = [[int(x) for x in rng.integers(0, vocab, a.input_len)]
                         for _ in range(a.requests)]
                t0 = time.perf_counter()
                outs = llm.generate(prompt_token_ids=batch, sampling_params=params)
                wall = time.perf_counter() - t0
                rates[key].append(sum(len(o.outputs[0].token_ids) for o in outs) / wall)
            del llm
            gc.collect()
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"backend {backend}; {a.requests} x ({a.input_len} in, {a.output_len} out)")
    for k, v in rates.items():
        print(f"{k:5s}: {med[k]:9.1f} output tok/s (rounds {min(v):.1f} .. {max(v):.1f})")
    print(f"LLM / bench: {med['llm'] / med['bench']:.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"backend": backend, "requests": a.requests, "input_len": a.input_len,
                       "output_len": a.output_len, "output_tokens_per_s": rates,
                       "median": med, "ratio": med["llm"] / med["bench"]}, f)


if __name__ == "__main__":
    main()
