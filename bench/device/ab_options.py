#!/usr/bin/env python3
"""Engine-option A/B of the decode step on the device: `pagoda bench --json` on one random
checkpoint, alternating the variants round by round (A, B, ..., A, B, ...), every run with the
same workload and engine settings plus the variant's own options (kernel options, --overlap).
Writes one JSON record (commit, GPU, every sample; bench/tables.py renders its "ab" table) to
--out and prints a median [min-max] line per (batch, variant) with the ratio to the first
variant (> 1: the variant's step is shorter).

  python3 bench/device/ab_options.py --pagoda build/pagoda --model /tmp/ckpt-1b --commit SHA \
      --batches 1,64 --rounds 3 --variant base= \
      --variant chunk64="--kernel-option decode_min_chunk=64" --variant ovl="--overlap on" \
      --out ab.json
"""
import argparse
import datetime
import json
import statistics
import subprocess


def bench(args, bs, options):
    cmd = [args.pagoda, "bench", "--model", args.model, "--backend", "cuda", "--json",
           "--requests", str(bs), "--max-running", str(bs), "--pool-tokens", "65536",
           "--chunk-size", "0", "--page-size", "16", "--input-len", str(args.input_len),
           "--output-len", str(args.output_len)]
    cmd += options
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: rc {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--variant", action="append", required=True,
                    help="NAME=ARGS: more `pagoda bench` arguments, split at spaces (empty: none)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    variants = []
    for v in args.variant:
        name, _, opts = v.partition("=")
        variants.append((name, opts.split()))
    fields = ["name", "driver_version", "clocks.sm", "clocks.max.sm", "clocks.max.mem"]
    gpus = []
    for line in subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}",
                                "--format=csv,noheader"],
                               capture_output=True, text=True).stdout.strip().splitlines():
        v = [x.strip() for x in line.split(",")]
        gpus.append(dict(zip(["name", "driver", "sm_mhz", "sm_max_mhz", "mem_max_mhz"], v)))
    samples = []
    for r in range(args.rounds):
        for bs in [int(b) for b in args.batches.split(",")]:
            for name, opts in variants:
                j = bench(args, bs, opts)
                samples.append({"round": r, "batch": bs, "variant": name,
                                "decode_step_ms": j["decode_step_ms"],
                                "output_tok_s": j.get("output_tokens_per_s")})
                print(f"round {r} batch {bs} {name}: {j['decode_step_ms']:.4f} ms", flush=True)
    record = {"commit": args.commit, "kind": "ab", "group": "ab",
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "gpus": gpus,
              "ab": {"model": args.model, "input_len": args.input_len,
                     "output_len": args.output_len,
                     "variants": [{"name": n, "options": o} for n, o in variants],
                     "samples": samples}}
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    base = variants[0][0]
    for bs in [int(b) for b in args.batches.split(",")]:
        def steps(name):
            return [s["decode_step_ms"] for s in samples if s["batch"] == bs and s["variant"] == name]
        b = steps(base)
        for name, _ in variants:
            v = steps(name)
            ratios = [x / y for x, y in zip(b, v)]
            print(f"batch {bs} {name}: {statistics.median(v):.4f} ms [{min(v):.4f}-{max(v):.4f}]"
                  f"  {base}/{name} {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]")


if __name__ == "__main__":
    main()
