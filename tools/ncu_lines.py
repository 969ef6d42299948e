#!/usr/bin/env python3
"""Attributes an Nsight Compute per-instruction export to source lines, without a GPU.

Input: the SASS source page of one kernel launch (`ncu -i REPORT --page source --csv
--print-source sass`, as the since-removed h200 profiling scripts wrote it: one row per SASS
instruction, with its warp-stall samples and how many times warps executed it; .gz read too).
The export has no line numbers, so the kernel's source file is compiled here, with its own
command from the build's compile_commands.json and -lineinfo (at --rev REV: a temporary git
worktree of that commit, for a profile of an older tree), disassembled with `nvdisasm -gi`, and
the function whose opcode sequence equals the export's is taken; none equal: exit 1 (the
compiled code is not the profiled code). Prints:
  * per class of instructions executed the same number of times (once per tile, per unit, per
    launch and per warp ...; --classes N, the N with most samples): its shares of the stall
    samples and of the executed warp instructions, its static size, and its source lines (most
    samples first; --lines N of them);
  * --grep REGEX: the share of samples and of executed instructions on the lines whose source
    text matches (e.g. a division: '/ G\\b|% G\\b').
A line is named by its innermost file:line (a helper's line when inlined) and the kernel-body
line it was inlined at.

usage: ncu_lines.py EXPORT compile_commands.json SOURCE [--rev REV] [--arch sm_90a]
                    [--classes 8] [--lines 12] [--grep REGEX]
nvdisasm: the CUDA toolkit's, $NVDISASM, or scripts/sass_tools.sh fetch (.sass-tools/bin)."""
import argparse
import contextlib
import collections
import csv
import gzip
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_sm90_ptxas import nvcc_command  # noqa: E402
from sass_diff import ROOT, compile_cubin, compile_entry, find_tool, rev_tree  # noqa: E402


def opcode(ins: str) -> str:
    """The opcode of a SASS instruction, its guard predicate dropped."""
    parts = ins.strip().split()
    if parts and parts[0].startswith("@"):
        parts = parts[1:]
    return parts[0] if parts else ""


def read_export(path: str) -> tuple[str, list[dict]]:
    """(kernel name, rows of {sass, samples, executed}) of an ncu source-page CSV."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        lines = [ln for ln in f if ln.strip() and not ln.startswith("==")]
    rows = list(csv.reader(lines))
    name = ""
    while rows and rows[0] and rows[0][0] != "Address":
        if rows[0][0] == "Kernel Name" and len(rows[0]) > 1:
            name = rows[0][1]
        rows = rows[1:]
    if not rows:
        sys.exit(f"{path}: no header row")
    head = rows[0]

    def col(text: str) -> int:
        if text not in head:
            sys.exit(f"{path}: no column {text!r}")
        return head.index(text)

    src, samp, ex = (col("Source"), col("Warp Stall Sampling (All Samples)"),
                     col("Instructions Executed"))
    num = lambda s: int(float(s.replace(",", "") or 0))  # noqa: E731
    return name, [{"sass": r[src], "samples": num(r[samp]), "executed": num(r[ex])}
                  for r in rows[1:] if len(r) > max(src, samp, ex)]


def parse_listing(text: str) -> dict[str, list[tuple[str, tuple]]]:
    """`nvdisasm -gi` output -> function -> [(instruction, location chain)], the chain being
    (file basename, line) from the innermost location outwards (the kernel body's line last)."""
    out, cur, locs, after_ins = {}, None, [], True
    for line in text.splitlines():
        m = re.match(r"\.text\.(\S+):\s*$", line)
        if m:
            cur, locs, after_ins = out.setdefault(m.group(1), []), [], True
            continue
        m = re.match(r'\s*//## File "([^"]+)", line (\d+)(.*)', line)
        if m:
            if after_ins:
                locs, after_ins = [], False
            locs.append(m)
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if m and cur is not None:
            after_ins = True
            # One comment line per inlining level, innermost first; each names the line it is
            # inlined at, which the next comment line repeats as its own.
            chain = [(os.path.basename(x.group(1)), int(x.group(2))) for x in locs]
            cur.append((m.group(1), tuple(chain)))
    return out


def match_function(funcs: dict, rows: list[dict]) -> tuple[str, list] | None:
    want = [opcode(r["sass"]) for r in rows]
    for name, ins in funcs.items():
        if len(ins) == len(want) and all(opcode(i) == w for (i, _), w in zip(ins, want)):
            return name, ins
    return None


class Sources:
    """Source text of a (basename, line), from the tree the kernel was compiled in."""

    def __init__(self, root: str):
        self.root, self.files = root, {}

    def text(self, base: str, line: int) -> str:
        if base not in self.files:
            found = []
            for d, _, names in os.walk(os.path.join(self.root, "src")):
                if base in names:
                    found.append(os.path.join(d, base))
            self.files[base] = []
            if found:
                with open(found[0]) as f:
                    self.files[base] = f.read().split("\n")
        lines = self.files[base]
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def label(chain: tuple, src: Sources) -> str:
    if not chain:
        return "(no line)"
    inner = chain[0]
    where = f"{inner[0]}:{inner[1]}"
    if len(chain) > 1 and chain[-1] != inner:
        where += f" @ {chain[-1][0]}:{chain[-1][1]}"
    return f"{where}  {src.text(*inner)[:72]}"


def report(rows: list[dict], ins: list, src: Sources, classes: int, nlines: int,
           grep: str | None) -> str:
    samples = sum(r["samples"] for r in rows) or 1
    executed = sum(r["executed"] for r in rows) or 1
    out = [f"{len(rows)} instructions, {samples} stall samples, {executed} warp instructions "
           f"executed"]
    by_class = collections.defaultdict(list)
    for r, (_, chain) in zip(rows, ins):
        by_class[r["executed"]].append((r, chain))
    top = sorted(by_class.items(), key=lambda kv: -sum(r["samples"] for r, _ in kv[1]))
    for ex, members in top[:classes]:
        s = sum(r["samples"] for r, _ in members)
        out.append(f"\nexecuted {ex:>9} times: {len(members):5} instructions, "
                   f"{100 * s / samples:5.1f} % of samples, "
                   f"{100 * ex * len(members) / executed:5.1f} % of executed")
        per = collections.defaultdict(lambda: [0, 0])
        for r, chain in members:
            key = (chain[0], chain[-1]) if chain else ()
            per[key][0] += 1
            per[key][1] += r["samples"]
        for key, (n, s2) in sorted(per.items(), key=lambda kv: (-kv[1][1], -kv[1][0]))[:nlines]:
            out.append(f"  {n:5} ins {100 * s2 / samples:5.2f} %  {label(key, src)}")
    if grep:
        rx = re.compile(grep)
        s = e = 0
        for r, (_, chain) in zip(rows, ins):
            if chain and rx.search(src.text(*chain[0])):
                s += r["samples"]
                e += r["executed"]
        out.append(f"\nlines matching {grep!r}: {100 * s / samples:.1f} % of samples, "
                   f"{100 * e / executed:.1f} % of executed warp instructions")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export")
    ap.add_argument("compile_commands")
    ap.add_argument("source")
    ap.add_argument("--rev", help="compile this git revision (a temporary worktree)")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--lines", type=int, default=12)
    ap.add_argument("--grep")
    a = ap.parse_args()

    nvdisasm = find_tool("nvdisasm")
    if not nvdisasm:
        sys.exit("no nvdisasm: install the CUDA toolkit's, set NVDISASM, or run "
                 "scripts/sass_tools.sh fetch")
    name, rows = read_export(a.export)
    entry = compile_entry(a.compile_commands, a.source)
    cmd = nvcc_command(entry, a.arch)
    if "-lineinfo" not in cmd:
        cmd.append("-lineinfo")
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        root = ROOT
        if a.rev:
            root = stack.enter_context(rev_tree(a.rev, tmp))
            cmd = [x.replace(ROOT + "/", root + "/") for x in cmd]
        cubin = os.path.join(tmp, "k.cubin")
        compile_cubin(cmd, entry["directory"], cubin)
        run = subprocess.run([nvdisasm, "-gi", cubin], capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"nvdisasm failed: {run.stderr.strip()}")
        found = match_function(parse_listing(run.stdout), rows)
        if found is None:
            print(f"no function of {a.source} at {a.rev or 'the working tree'} has the "
                  f"export's {len(rows)} opcodes ({name[:100]})")
            return 1
        print(f"{found[0]}\n(matched {len(rows)} instructions; {name[:120]})")
        print(report(rows, found[1], Sources(root), a.classes, a.lines, a.grep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
