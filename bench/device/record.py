#!/usr/bin/env python3
"""Folds one bench/device/run.sh run's working folder into ONE JSON record.

Usage: record.py DIR --kind KIND --group GROUP --commit SHA --stages "build tests ..." --out FILE

The record (schema 1) holds what the tables are generated from, every sample included:
  commit, kind, group, stages, date (UTC), gpus (nvidia-smi: name, driver, memory, SM and memory
  clocks now and at most, power limit; empty for kind cpu), cpu (model name and threads),
  torch / cuDNN / FlashInfer versions;
  build       {"rc", "seconds", "targets"}
  tests       [{"name", "status", "seconds"}] from ctest's JUnit file; sanitizers' summary lines
  kernels     {"ceilings": {"copy_gbps", "gemm_tflops"}, "rounds": [{"ours": [row...],
              "peers": [row...]}]}: a row is pagoda_cuda_bench's / peers.py's JSON line (ms =
              median, samples_ms = every timed call), rounds in the order they ran
  kernel_ab   {"variants": [{"name", "cases", "options"}], "rounds": [{"base": [row...], name:
              [row...]}]} (run.sh ab_kernels: pagoda_cuda_bench with each variant's kernel options
              and, in the same round, with none, "base"); ab_tests: the variant tests' gtest
              cases ({"name", "result", "seconds"})
  engine      bench/engine_real.py's summary.json
  agreement   bench/agreement_vs_transformers.py's record (DeepSeek layouts vs transformers)
  spec        {run name: `pagoda bench --spec ... --json`}
  serve       bench/serve_bench.py's results.json
  tp          {"bench": {"<layout>_b<batch>_tp<n>": `pagoda bench --json`}, "generate_f32":
              {"prompts", "identical", "first_token_identical"}}
  hicache     {"pinned_copy": {"h2d_pinned_gbps", "samples_ms"}, "<layout>_<device|host|storage>":
              `pagoda bench --workload multiturn --json`, "loadback_<layout>_e<new tokens>":
              `pagoda bench --workload loadback --json`}
  python      {"torch_tests": pytest's last line, "vs_flashinfer": [bench/python_vs_flashinfer.py
              row...], "llm_vs_bench": bench/llm_vs_bench.py's --json}
  amx         {"cpu": model name and threads, "cpu_flags": [avx512* / amx* flags], "gtests": {binary: [{"name", "result",
              "seconds"}]} (gtest's JSON), "conformance": its last line,
              "cpu_vs_torch": bench/cpu_vs_torch.py's rows, "cpu_model_vs_torch":
              bench/cpu_model_vs_torch.py's document} (issue 51, the device host's CPU)
  profile     {"copy_gbps", "policy", "runs": {"<layout>_b<batch>": run.sh's meta (layout, batch,
              steps, launch_skip, lengths, ncu rc and seconds) + "bench" (the unprofiled
              `pagoda bench --json`'s decode step) + at batch 1 "ab" ({option name: [decode
              step ms per round]}, "base" without one) + "ncu_passes" + tools/ncu_forwards.py's
              step_profile() of the ncu log (per kernel group and step: launches, ns, DRAM
              bytes; per step: kernels, ns), or "error" where the log could not be read}}
  hybrid      {"meta": run.sh's sizes (backend, dtype, layouts, lengths, the byte budget),
              "swa_step_<off|on>", "swa_fit_<off|on>", "mamba_step_<ctx>", "ttft_cached",
              "ttft_cold": `pagoda bench --json`; "attn_decode_<ctx>", "scan_decode",
              "scan_prefill": `pagoda kernels --json`} (issue 49's hybrid benchmarks)
  dsa         {"b<batch>_l<context>_h<q heads>": `pagoda kernels --op dsa-decode --json`} (issue
              50's DSA decode step vs dense MLA)
Missing parts (a stage not run, a step that failed) are left out; the record says which stages
were asked for. Reading only: nothing in DIR is changed."""
import argparse
import csv
import datetime
import glob
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ncu_forwards  # noqa: E402 - tools/ncu_forwards.py


def read_json(path):
    """A JSON document, or the last JSON line of a file that has other lines first."""
    try:
        text = open(path).read()
    except OSError:
        return None
    try:
        return json.loads(text)
    except ValueError:
        for line in reversed(text.strip().splitlines()):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def read_jsonl(path):
    rows = []
    try:
        for line in open(path):
            line = line.strip()
            if line.startswith("{"):
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if "samples_ms" in row:  # CUDA events resolve ~0.5 us: 10 ns is plenty
                    row["samples_ms"] = [round(x, 5) for x in row["samples_ms"]]
                rows.append(row)
    except OSError:
        pass
    return rows


def gpus(path):
    keys = ["index", "name", "driver", "memory", "sm_mhz", "sm_max_mhz", "mem_mhz", "mem_max_mhz",
            "power_limit"]
    out = []
    try:
        for row in csv.reader(open(path)):
            if len(row) == len(keys):
                out.append({k: v.strip() for k, v in zip(keys, row)})
    except OSError:
        pass
    return out


def tests(d):
    out = []
    try:
        root = ET.parse(os.path.join(d, "ctest_gpu.xml")).getroot()
    except (OSError, ET.ParseError):
        return None
    for tc in root.iter("testcase"):
        status = tc.get("status") or ("failed" if tc.find("failure") is not None else "run")
        out.append({"name": tc.get("name"), "status": status,
                    "seconds": float(tc.get("time") or 0)})
    return out


def numbered(d, stem):
    found = {}
    for path in glob.glob(os.path.join(d, stem + "_r*.jsonl")):
        m = re.search(r"_r(\d+)\.jsonl$", path)
        if m:
            found[int(m.group(1))] = read_jsonl(path)
    return [found[k] for k in sorted(found)]


def ceilings(d):
    """peers.py --ceilings' values: {"copy_gbps", "gemm_tflops"}."""
    return {r["ceiling"]: r["value"] for r in read_jsonl(os.path.join(d, "ceilings.jsonl"))
            if "ceiling" in r}


def kernels(d):
    ours, peers = numbered(d, "ours"), numbered(d, "peers")
    if not ours:
        return None
    ceil = ceilings(d)
    rounds = [{"ours": o, "peers": peers[i] if i < len(peers) else []} for i, o in enumerate(ours)]
    return {"ceilings": ceil, "rounds": rounds,
            "policy": "shuffled pages and random data on both sides; 3 warm-up calls, then 30 "
                      "timed calls, each after an untimed 256 MiB device write (L2 flushed, as "
                      "triton's do_bench does), CUDA events around the call alone; rounds "
                      "interleaved: ours, peers, ours, peers, ..."}


def kernel_ab(d):
    """run.sh ab_kernels' rounds: ab_<name>_r<k>.jsonl per variant (and "base") and round, the
    variants from ab_variants.txt (NAME|CASES|OPTIONS lines)."""
    try:
        lines = [ln.strip() for ln in open(os.path.join(d, "ab_variants.txt")) if ln.strip()]
    except OSError:
        return None
    variants = []
    for ln in lines:
        name, cases, options = (ln.split("|") + ["", ""])[:3]
        variants.append({"name": name, "cases": cases, "options": options.split()})
    by_name = {v["name"]: numbered(d, "ab_" + v["name"]) for v in [{"name": "base"}, *variants]}
    n = max((len(r) for r in by_name.values()), default=0)
    if n == 0:
        return None
    rounds = [{name: rows[i] if i < len(rows) else [] for name, rows in by_name.items()}
              for i in range(n)]
    return {"variants": variants, "rounds": rounds,
            "policy": "pagoda_cuda_bench's timing (see kernels) for each variant's cases with its "
                      "kernel options and, in the same round, with the defaults (base); rounds "
                      "alternate the order (base first, then the variants; then the variants "
                      "reversed, then base)"}


def json_by_name(folder, prefix=""):
    """{name: document} for folder/<prefix>*.json (name: the file name less the prefix and
    ".json"); files that hold no JSON are left out."""
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, prefix + "*.json"))):
        j = read_json(path)
        if j is not None:
            out[os.path.basename(path)[len(prefix):-len(".json")]] = j
    return out


def tp(d):
    tdir = os.path.join(d, "tp")
    if not os.path.isdir(tdir):
        return None
    out = {"bench": json_by_name(tdir, "bench_")}
    a = read_jsonl(os.path.join(tdir, "gen_f32_tp1.jsonl"))
    b = read_jsonl(os.path.join(tdir, "gen_f32_tp2.jsonl"))
    if a and len(a) == len(b):
        ta = [r.get("output_token_ids") for r in a]
        tb = [r.get("output_token_ids") for r in b]
        out["generate_f32"] = {"prompts": len(a), "identical": sum(x == y for x, y in zip(ta, tb)),
                               "first_token_identical": sum(bool(x) and bool(y) and x[0] == y[0]
                                                            for x, y in zip(ta, tb))}
    return out


def hicache(d):
    hdir = os.path.join(d, "hicache")
    if not os.path.isdir(hdir):
        return None
    return json_by_name(hdir) or None


def python(d):
    pdir = os.path.join(d, "python")
    if not os.path.isdir(pdir):
        return None
    out = {"vs_flashinfer": read_jsonl(os.path.join(pdir, "vs_flashinfer.jsonl")),
           "llm_vs_bench": read_json(os.path.join(pdir, "llm_vs_bench.json"))}
    try:
        lines = open(os.path.join(pdir, "pytest_torch.log")).read().strip().splitlines()
        # pytest's summary line; a run that crashed (50a3320: a segfault on import) has none.
        summary = [ln for ln in lines if re.search(r"\d+ (passed|failed|error)", ln)]
        out["torch_tests"] = summary[-1] if summary else "no pytest summary: the run crashed (see the log)"
    except OSError:
        pass
    return {k: v for k, v in out.items() if v}


def profile(d):
    pdir = os.path.join(d, "profile")
    if not os.path.isdir(pdir):
        return None
    runs = {}
    for path in sorted(glob.glob(os.path.join(pdir, "*.meta.json"))):
        tag = os.path.basename(path)[:-len(".meta.json")]
        run = read_json(path) or {}
        bench = read_json(os.path.join(pdir, tag + ".bench.json")) or {}
        run["bench"] = {k: bench[k] for k in ("decode_step_ms", "decode_steps", "cuda_graph_steps",
                                              "decode_batch_mean", "cuda_graphs") if k in bench}
        # Option A/B at batch 1 ({name: [decode_step_ms per round]}; "base": no option).
        ab = {}
        for f in sorted(glob.glob(os.path.join(pdir, tag + ".ab_*_*.json"))):
            k, name = re.match(r".*\.ab_(\d+)_(\w+)\.json$", f).groups()
            step = (read_json(f) or {}).get("decode_step_ms")
            ab.setdefault(name, {})[int(k)] = step
        if ab:
            run["ab"] = {name: [v[k] for k in sorted(v)] for name, v in ab.items()}
        logs = [os.path.join(pdir, tag + ext) for ext in (".ncu.csv", ".ncu.err")]
        passes = [int(p) for f in logs if os.path.exists(f)
                  for p in re.findall(r"- (\d+) pass", open(f, errors="replace").read())]
        run["ncu_passes"] = max(passes, default=None)
        try:
            with open(logs[0], newline="", errors="replace") as f:
                launched = ncu_forwards.read_kernels(f)
            run.update(ncu_forwards.step_profile(launched, run.get("steps", 4)))
        except (OSError, ValueError, KeyError) as e:
            run["error"] = f"{type(e).__name__}: {e}"
        runs[tag] = run
    if not runs:
        return None
    return {"copy_gbps": ceilings(d).get("copy_gbps"), "runs": runs,
            "policy": "ncu --graph-profiling node (CUDA graphs on, kernels timed inside them) "
                      "--cache-control none --clock-control none, metrics gpu__time_duration.sum, "
                      "dram__bytes_read.sum + dram__bytes_write.sum, dram__throughput.avg."
                      "pct_of_peak_sustained_elapsed; kernels run one at a time, so a step's kernel "
                      "sum has no launch gaps and no programmatic-dependent-launch overlap; the "
                      "last N forwards of a run whose requests all decode together to the end"}


def gtest_cases(path):
    """[{"name", "result", "seconds"}] of a gtest --gtest_output=json file (None when absent);
    result is gtest's ("COMPLETED", "SKIPPED", ...) or "FAILED" for a case with failures."""
    j = read_json(path)
    if j is None:
        return None
    return [{"name": f"{suite['name']}.{case['name']}",
             "result": "FAILED" if case.get("failures") else case.get("result", "?"),
             "seconds": float(str(case.get("time", "0")).rstrip("s") or 0)}
            for suite in j.get("testsuites", []) for case in suite.get("testsuite", [])]


def conformance_result(adir):
    """The amx row's result cell of `pagoda conformance --output` (e.g. "pass (108 run, 98
    unsupported)"), or the log's last line when the matrix is missing."""
    try:
        for line in open(os.path.join(adir, "conformance.md"), errors="replace"):
            if line.startswith("| amx |"):
                return line.strip().strip("|").split("|")[-1].strip()
    except OSError:
        pass
    try:
        lines = open(os.path.join(adir, "conformance.log"), errors="replace").read().strip().splitlines()
        return lines[-1] if lines else None
    except OSError:
        return None


def amx(d):
    adir = os.path.join(d, "amx")
    if not os.path.isdir(adir):
        return None
    out = {"gtests": {}}
    try:
        out["cpu"] = open(os.path.join(adir, "cpu_model.txt")).read().strip()
        out["cpu_flags"] = open(os.path.join(adir, "cpu_flags.txt")).read().split()
        out["conformance"] = conformance_result(adir)
    except OSError:
        pass
    for name in ("model_tests", "engine_tests"):
        cases = gtest_cases(os.path.join(adir, name + ".json"))
        if cases is not None:
            out["gtests"][name] = cases
    out["cpu_vs_torch"] = read_json(os.path.join(adir, "cpu_vs_torch.json"))
    out["cpu_model_vs_torch"] = read_json(os.path.join(adir, "cpu_model_vs_torch.json"))
    return {k: v for k, v in out.items() if v}


def versions(d):
    out = {}
    try:
        torch_v = open(os.path.join(d, "torch.txt")).read().split()
        out["torch"], out["cudnn"] = torch_v[0], torch_v[1]
    except (OSError, IndexError):
        pass
    for path in glob.glob("/tmp/site/flashinfer_python-*.dist-info"):
        out["flashinfer"] = os.path.basename(path).split("-")[1]
    return out


def build_record(d, kind, group, commit, stages):
    rec = {"schema": 1, "commit": commit, "kind": kind, "group": group, "stages": stages.split(),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "gpus": gpus(os.path.join(d, "gpu.csv")), "versions": versions(d)}
    try:
        rec["cpu"] = open(os.path.join(d, "cpu.txt")).read().strip()
    except OSError:
        pass
    parts = {
        "build": read_json(os.path.join(d, "build.json")),
        "tests": tests(d),
        "sanitizers": {os.path.basename(p)[len("sanitize_"):-4]:
                       [ln.strip() for ln in open(p) if "SUMMARY" in ln]
                       for p in glob.glob(os.path.join(d, "sanitize_*.log"))} or None,
        "kernels": kernels(d),
        "kernel_ab": kernel_ab(d),
        "ab_tests": gtest_cases(os.path.join(d, "ab_tests.json")),
        "engine": read_json(os.path.join(d, "engine", "summary.json")),
        "agreement": read_json(os.path.join(d, "agree", "result.json")),
        "spec": json_by_name(os.path.join(d, "spec")) or None,
        "serve": read_json(os.path.join(d, "serve", "results.json")),
        "tp": tp(d),
        "hicache": hicache(d),
        "python": python(d),
        "profile": profile(d),
        "amx": amx(d),
        "hybrid": json_by_name(os.path.join(d, "hybrid")) or None,
        "dsa": json_by_name(os.path.join(d, "dsa")) or None,
    }
    rec.update({k: v for k, v in parts.items() if v is not None})
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--kind", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--stages", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rec = build_record(a.dir, a.kind, a.group, a.commit, a.stages)
    with open(a.out, "w") as f:  # compact: thousands of samples
        json.dump(rec, f, separators=(",", ":"))
    print(f"record: {a.out} ({', '.join(k for k in rec if k not in ('schema',))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
