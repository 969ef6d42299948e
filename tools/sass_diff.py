#!/usr/bin/env python3
"""Compares the SASS of one CUDA source file's kernels between this tree and another commit (or
another tree): a refactor that should not change the code can be shown not to, and a kernel
change can be sized, without a GPU.

The file is compiled for one architecture (default sm_90a) with its own command from the build's
compile_commands.json (check_sm90_ptxas.py's nvcc_command), once here and once in the base: a
git worktree of --base REV made for the run (removed after), or the tree at --base-tree DIR (the
command's paths under this checkout point into it). Each cubin goes through `cuobjdump -sass`;
per kernel the listings are compared with addresses and encodings dropped (--loose also drops
register numbers and branch targets, so that renaming and reordering alone read as equal
counts). Prints, per kernel: identical, or the differing line count and the instruction and
HGMMA counts on each side; kernels present on one side only are named.

cuobjdump and nvdisasm: from the CUDA toolkit, $CUOBJDUMP, or `scripts/sass_tools.sh fetch`
(PyPI's nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm wheels under .sass-tools/, git-ignored),
for a toolkit without them.

Usage: sass_diff.py <compile_commands.json> <source path suffix> (--base REV | --base-tree DIR)
                    [--arch sm_90a] [--kernels REGEX] [--loose] [--expect-identical]
Exit 1 on a failed compile or a missing tool; with --expect-identical also when any kernel
differs (after --loose, if given) or is on one side only."""
import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_sm90_ptxas import nvcc_command  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_tool(name: str) -> str | None:
    env = os.environ.get(name.upper())
    if env and os.access(env, os.X_OK):
        return env
    for d in [*os.environ.get("PATH", "").split(os.pathsep), "/usr/local/cuda/bin",
              os.path.join(ROOT, ".sass-tools", "bin")]:
        p = os.path.join(d, name)
        if d and os.access(p, os.X_OK):
            return p
    return None


@contextlib.contextmanager
def rev_tree(rev: str, tmp: str):
    """A temporary git worktree of this checkout at rev under tmp (removed on exit); yields its
    path."""
    path = os.path.join(tmp, "rev")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "-q", "--detach", path, rev], check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", path], check=False)


def compile_entry(compile_commands: str, source: str) -> dict:
    """The compile_commands.json entry of the file whose path ends with /source (exits if none)."""
    with open(compile_commands) as f:
        entries = [e for e in json.load(f) if e["file"].endswith("/" + source)]
    if not entries:
        sys.exit(f"{source} is not in {compile_commands}")
    return entries[0]


def compile_cubin(cmd: list[str], cwd: str, out: str) -> None:
    run = subprocess.run(cmd + ["-cubin", "-o", out], capture_output=True, text=True, cwd=cwd)
    if run.returncode != 0:
        sys.exit(f"compile failed ({run.returncode}): {' '.join(cmd)}\n{run.stderr[-4000:]}")


def parse_sass(text: str, loose: bool) -> dict[str, list[str]]:
    """`cuobjdump -sass` output -> kernel name -> its instructions, addresses and encodings
    dropped (loose: register / predicate numbers and hex immediates too)."""
    out, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            # An anonymous namespace's mangled name carries a hash of the file's path, which
            # differs between the two trees.
            cur = out.setdefault(re.sub(r"_GLOBAL__N__[0-9a-f]+_", "_GLOBAL__N__", m.group(1)), [])
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;?\s*/\* 0x[0-9a-f]+ \*/", line)
        if cur is None or not m:
            continue
        ins = m.group(1).rstrip(" ;")
        if loose:
            ins = re.sub(r"\bU?R\d+\b", "R", ins)
            ins = re.sub(r"\bU?P\d\b", "P", ins)
            ins = re.sub(r"0x[0-9a-f]+", "0x", ins)
        cur.append(ins)
    return out


def kernels(cuobjdump: str, cubin: str, loose: bool) -> dict[str, list[str]]:
    env = dict(os.environ)
    nvdisasm = find_tool("nvdisasm")
    if nvdisasm:
        env["PATH"] = os.path.dirname(nvdisasm) + os.pathsep + env.get("PATH", "")
    run = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, env=env)
    if run.returncode != 0:
        sys.exit(f"cuobjdump failed: {run.stderr.strip()}")
    return parse_sass(run.stdout, loose)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("compile_commands")
    ap.add_argument("source")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--base", help="a git revision of this checkout")
    g.add_argument("--base-tree", help="another copy of the source tree")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--kernels", default="", help="regex on the mangled kernel names")
    ap.add_argument("--loose", action="store_true")
    ap.add_argument("--expect-identical", action="store_true")
    a = ap.parse_args()

    cuobjdump = find_tool("cuobjdump")
    if not cuobjdump:
        sys.exit("no cuobjdump: install the CUDA toolkit's, set CUOBJDUMP, or run "
                 "scripts/sass_tools.sh fetch")
    entry = compile_entry(a.compile_commands, a.source)
    cmd = nvcc_command(entry, a.arch)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        base_root = stack.enter_context(rev_tree(a.base, tmp)) if a.base else a.base_tree
        base_root = os.path.abspath(base_root)
        base_cmd = [x.replace(ROOT + "/", base_root + "/") for x in cmd]
        compile_cubin(cmd, entry["directory"], os.path.join(tmp, "head.cubin"))
        compile_cubin(base_cmd, entry["directory"], os.path.join(tmp, "base.cubin"))
        head = kernels(cuobjdump, os.path.join(tmp, "head.cubin"), a.loose)
        base = kernels(cuobjdump, os.path.join(tmp, "base.cubin"), a.loose)
    bad = 0
    for name in sorted(set(head) | set(base)):
        if a.kernels and not re.search(a.kernels, name):
            continue
        if name not in base or name not in head:
            print(f"only in {'head' if name in head else 'base'}: {name}")
            bad += 1
            continue
        h, b = head[name], base[name]
        if h == b:
            print(f"identical ({len(h)} instructions): {name}")
            continue
        bad += 1
        differing = sum(1 for x, y in zip(h, b) if x != y) + abs(len(h) - len(b))
        hg = sum("HGMMA" in x for x in h), sum("HGMMA" in x for x in b)
        print(f"differs at {differing} lines (instructions {len(b)} -> {len(h)}, HGMMA {hg[1]} -> "
              f"{hg[0]}): {name}")
    return 1 if a.expect_identical and bad else 0


if __name__ == "__main__":
    sys.exit(main())
