#!/usr/bin/env python3
"""Hostile command lines and files through the `pagoda` CLI (issue 9 item 3).

Each case must end with exit status 2 (pagoda::Error) and a message naming the bad field, never a
signal, a std::bad_alloc / length_error ("fatal") or a message about something that should not
have been reached yet: engine options are checked before the model is loaded (the model path
given does not exist, so an error about it means the check came too late), and `kernels` shape
products are checked before any buffer is allocated.

Kernel options (--kernel-option NAME=VALUE) with an unknown name or a bad value fail the command
line of every command that takes them, naming the option.

Also: a drained `pagoda bench --json` reports leaked_pages 0 and, after evicting its prefix
cache, every page free (pages_free_after_drain == pages_total, none referenced), and prints the
kernel options it ran with; with a file storage tier its storage puts equal the page files written.

Usage: check_hostile_inputs.py PAGODA_BINARY WORK_DIR
"""
import json
import os
import subprocess
import sys

failures = []


def run_case(name, args, must_contain, must_not_contain=()):
    p = subprocess.run([PAGODA] + args, capture_output=True, text=True, timeout=60)
    err = p.stderr + p.stdout
    ok = p.returncode == 2 and "pagoda: error:" in err
    ok = ok and all(s in err for s in must_contain)
    ok = ok and not any(s in err for s in must_not_contain)
    status = "ok  " if ok else "FAIL"
    print(f"{status} {name}: rc={p.returncode} {err.strip().splitlines()[-1] if err.strip() else ''}")
    if not ok:
        failures.append(f"{name}: rc={p.returncode}, output:\n{err}")


PAGODA, WORK = sys.argv[1], sys.argv[2]
os.makedirs(WORK, exist_ok=True)
missing = os.path.join(WORK, "no_such_model_dir")

# kernels: shape arithmetic in int64, bounded before allocation.
run_case("kernels int32 page overflow",
         ["kernels", "--batch", "100000", "--kv-len", "2000000000", "--page-size", "1"],
         ["exceed int32"])
run_case("kernels absurd head count / dim",
         ["kernels", "--batch", "1", "--kv-len", "1", "--q-heads", "2147483647",
          "--kv-heads", "2147483647", "--head-dim", "2147483647"], ["above 4096"])
run_case("kernels KV beyond memory",
         ["kernels", "--batch", "4096", "--kv-len", "1000000", "--page-size", "64"], ["limit 64"])
run_case("kernels verify mask beyond memory",
         ["kernels", "--op", "verify", "--batch", "64", "--kv-len", "1000000", "--q-len", "1000000",
          "--page-size", "1024", "--q-heads", "1", "--kv-heads", "1", "--head-dim", "8"],
         ["GiB of mask"])
run_case("kernels unknown backend", ["kernels", "--backend", "nosuch"], ["--backend 'nosuch'"])

# Engine options before the model: the model path does not exist, so mentioning it is a failure.
# serve, bench and generate share one engine flag block (cli/engine_options.h): each bad value
# fails each command naming its flag, either as a pagoda::Error (exit 2) or as a command-line
# parse error (CLI11's checks: exit 105).
ENGINE_COMMANDS = (["generate", "--prompt", "hi"], ["bench", "--requests", "1"],
                   ["serve", "--port", "0"])
# (flag, bad value): the message names the flag; an unknown backend is named by its value.
ENGINE_CASES = [(["--" + flag, value], "--" + flag) for flag, value in (
    ("page-size", "0"), ("pool-tokens", "8"), ("max-running", "-1"), ("chunk-size", "24"),
    ("max-prefill-tokens", "0"), ("policy", "lifo"), ("dtype", "f99"), ("kv-dtype", "int4"),
    ("cuda-graph", "maybe"), ("max-context-len", "-1"))]
ENGINE_CASES += [([flag, "nosuch"], "attention backend 'nosuch'")
                 for flag in ("--backend", "--prefill-backend", "--decode-backend")]
ENGINE_CASES += [(["--linear-backend", "nosuch"], "linear-attention backend 'nosuch'")]
for cmd in ENGINE_COMMANDS:
    for flags, expect in ENGINE_CASES:
        p = subprocess.run([PAGODA] + cmd + ["--model", missing, *flags], capture_output=True,
                           text=True, timeout=60)
        err = p.stderr + p.stdout
        ok = p.returncode in (2, 105) and expect in err and missing not in err
        print(f"{'ok  ' if ok else 'FAIL'} {cmd[0]} {' '.join(flags)}: rc={p.returncode} "
              f"{err.strip().splitlines()[-1] if err.strip() else ''}")
        if not ok:
            failures.append(f"{cmd[0]} {' '.join(flags)}: rc={p.returncode}, output:\n{err}")
    # Every engine flag, each with a valid value that is not its default, is accepted: the
    # command gets as far as loading the (missing) model and names it.
    run_case(f"{cmd[0]} accepts every engine flag",
             cmd + ["--model", missing, "--backend", "reference", "--linear-backend", "reference",
                    "--page-size", "32",
                    "--pool-tokens", "8192", "--max-running", "7", "--chunk-size", "64",
                    "--max-prefill-tokens", "512", "--policy", "lpm", "--dtype", "f32",
                    "--kv-dtype", "f32", "--cuda-graph", "off", "--max-context-len", "300",
                    "--no-radix", "--no-mixed", "--kernel-option", "cpu_bf16=off"], [missing])
# The same flag names on all three, as --help lists them.
def flags_of(cmd):
    out = subprocess.run([PAGODA, cmd, "--help"], capture_output=True, text=True, timeout=60).stdout
    return {w.split("=")[0].split(":")[0] for w in out.split() if w.startswith("--")}
ENGINE_FLAGS = {"--backend", "--prefill-backend", "--decode-backend", "--linear-backend",
                "--kernel-option",
                "--page-size", "--pool-tokens", "--max-running", "--chunk-size",
                "--max-prefill-tokens", "--policy", "--dtype", "--kv-dtype", "--cuda-graph",
                "--max-context-len", "--no-radix", "--no-mixed", "--hicache-ratio", "--tp"}
for cmd in ("generate", "bench", "serve"):
    lacking = ENGINE_FLAGS - flags_of(cmd)
    print(f"{'ok  ' if not lacking else 'FAIL'} {cmd} --help lists the engine flags "
          f"(lacking: {sorted(lacking)})")
    if lacking:
        failures.append(f"{cmd} lacks engine flags {sorted(lacking)}")
# Hierarchical cache options (one flag block on all three commands), checked before the model
# is loaded.
HICACHE_CASES = [
    (["--hicache-ratio", "-1"], "--hicache-ratio"),
    (["--hicache-ratio", "2", "--hicache-size", "1G"], "not both"),
    (["--hicache-ratio", "2", "--hicache-write-policy", "nope"], "write policy 'nope'"),
    (["--hicache-ratio", "2", "--hicache-storage", "redis://h:0"], "port must be in"),
    (["--hicache-ratio", "2", "--hicache-storage", "s3://b/k"], "scheme 's3'"),
    (["--hicache-ratio", "2", "--hicache-storage", "file:/tmp/x", "--hicache-prefetch-policy",
      "nope"], "prefetch policy 'nope'"),
]
for cmd in (["generate", "--prompt", "hi"], ["bench", "--requests", "1"], ["serve", "--port", "0"]):
    for flags, expect in HICACHE_CASES:
        run_case(f"{cmd[0]} {' '.join(flags)}", cmd + ["--model", missing, *flags], [expect],
                 [missing])
# Kernel options: checked while the command line is parsed (before anything is built).
for cmd in (["generate", "--prompt", "hi", "--model", missing], ["bench", "--model", missing],
            ["serve", "--model", missing], ["conformance", "--quick"], ["kernels"]):
    run_case(f"{cmd[0]} unknown kernel option", cmd + ["--kernel-option", "sm90_tmaa=0"],
             ["unknown kernel option 'sm90_tmaa'"], [missing])
    run_case(f"{cmd[0]} bad kernel option value", cmd + ["--kernel-option", "merge_threads=48"],
             ["merge_threads must be"], [missing])
run_case("bench pool smaller than a page",
         ["bench", "--requests", "1", "--model", missing, "--page-size", "16", "--pool-tokens", "8"],
         ["--pool-tokens"], [missing])

# A hostile config.json: a negative layer count with a sliding window (was "cannot create
# std::vector larger than max_size()").
bad = os.path.join(WORK, "bad_config")
os.makedirs(bad, exist_ok=True)
with open(os.path.join(bad, "config.json"), "w") as f:
    json.dump({"architectures": ["MistralForCausalLM"], "vocab_size": 1000, "hidden_size": 256,
               "intermediate_size": 512, "num_hidden_layers": -1, "num_attention_heads": 8,
               "num_key_value_heads": 2, "sliding_window": 4096}, f)
run_case("config num_hidden_layers -1 + sliding_window",
         ["generate", "--model", bad, "--token-ids", "1,2,3", "--max-new-tokens", "1"],
         ["num_hidden_layers"], ["max_size"])

# A drained bench reports its KV accounting: no leaked reference, and once the prefix cache is
# evicted every page free with refcount 0.
p = subprocess.run([PAGODA, "bench", "--requests", "6", "--max-new-tokens", "4", "--json",
                    "--kernel-option", "cpu_bf16=off", "--kernel-option", "sm90_max_blocks=3"],
                   capture_output=True, text=True, timeout=120)
try:
    j = json.loads(p.stdout.strip().splitlines()[-1])
    ko = j["kernel_options"]
    ok = (p.returncode == 0 and j["leaked_pages"] == 0 and j["idle_pages_accounted"] and
          j["drained_cache_tokens"] > 0 and j["pages_free_after_drain"] == j["pages_total"] and
          j["pages_referenced_after_drain"] == 0 and ko["cpu_bf16"] is False and
          ko["sm90_max_blocks"] == 3 and ko["mla_decode"] is True and ko["merge_threads"] == 0)
except (ValueError, KeyError, IndexError) as e:
    ok, j = False, {"error": str(e), "stderr": p.stderr[-2000:]}
print(f"{'ok  ' if ok else 'FAIL'} bench drained accounting: " +
      ", ".join(f"{k}={j.get(k)}" for k in ("leaked_pages", "drained_cache_tokens", "pages_total",
                                            "pages_free_after_drain", "pages_referenced_after_drain",
                                            "kernel_options")))
if not ok:
    failures.append(f"bench drained accounting: rc={p.returncode} {j}")

# With a file storage tier, the storage counters are read after the drain (evicting the host tier
# writes its pages): puts equals the page files the run left in the storage folder.
store = os.path.join(WORK, "bench_storage")
if os.path.isdir(store):
    for f in os.listdir(store):
        os.remove(os.path.join(store, f))
p = subprocess.run([PAGODA, "bench", "--requests", "6", "--max-new-tokens", "4", "--json",
                    "--page-size", "4", "--hicache-ratio", "2", "--hicache-storage", f"file:{store}"],
                   capture_output=True, text=True, timeout=120)
try:
    st = json.loads(p.stdout.strip().splitlines()[-1])["hicache"]["storage"]
    files = [f for f in os.listdir(store) if f.endswith(".kvpage")]
    ok = p.returncode == 0 and st["puts"] > 0 and st["puts"] == len(files) and st["put_errors"] == 0
except (ValueError, KeyError, IndexError, TypeError, OSError) as e:
    ok, st, files = False, {"error": str(e), "stderr": p.stderr[-2000:]}, []
print(f"{'ok  ' if ok else 'FAIL'} bench storage counters after the drain: puts {st.get('puts')}, "
      f"{len(files)} page files")
if not ok:
    failures.append(f"bench storage counters: rc={p.returncode} {st}")

# The load-back probe (cli/loadback_bench.h) needs the host tier and a page-aligned prefix; its
# host case loads back exactly the prefix's KV (twice the bytes for twice the prefix) and every
# case is timed once per round.
run_case("bench loadback without a host tier",
         ["bench", "--workload", "loadback", "--input-len", "256", "--requests", "1"],
         ["--hicache-ratio"])
run_case("bench loadback unaligned prefix",
         ["bench", "--workload", "loadback", "--input-len", "250", "--requests", "1",
          "--hicache-ratio", "2"], ["multiple of --page-size"])
lbs = {}
for prefix in (512, 1024):
    p = subprocess.run([PAGODA, "bench", "--workload", "loadback", "--input-len", str(prefix),
                        "--user-len", "32", "--requests", "2", "--hicache-ratio", "2", "--page-size",
                        "16", "--json"], capture_output=True, text=True, timeout=120)
    try:
        lbs[prefix] = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {
            "rc": p.returncode, "stderr": p.stderr[-2000:]}
    except (ValueError, IndexError) as e:
        lbs[prefix] = {"error": str(e), "stderr": p.stderr[-2000:]}
try:
    ok = (lbs[512]["load_bytes"] > 0 and lbs[1024]["load_bytes"] == 2 * lbs[512]["load_bytes"] and
          all(len(lb["ttft_ms"][c]["samples"]) == 2 and lb["ttft_ms"][c]["min"] > 0
              for lb in lbs.values() for c in ("cold", "device", "host")))
except (KeyError, TypeError):
    ok = False
print(f"{'ok  ' if ok else 'FAIL'} bench loadback: bytes loaded back " +
      ", ".join(f"{k}: {v.get('load_bytes')}" for k, v in lbs.items()))
if not ok:
    failures.append(f"bench loadback: {lbs}")

if failures:
    print(f"\n{len(failures)} case(s) failed:\n" + "\n".join(failures))
    sys.exit(1)
print("all hostile-input cases gave clear errors")
