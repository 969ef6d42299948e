#!/usr/bin/env python3
"""Checks ARCHITECTURE §2: every `#include "pagoda/<module>/..."` must name the including module
itself or a module it may depend on, and no source reads the environment (kernel variants are
typed configuration: backends/kernel_options.h) except the process-level settings in
GETENV_ALLOWED. Usage: check_layering.py <src-root>. Exit 1 on a violation."""
import pathlib
import re
import sys

LOW = ["core"]
ALLOWED = {
    "core": [],
    "platform": ["core"],
    "kv": ["core", "platform"],
    "cache": ["core", "kv"],
    "tier": ["core", "platform", "kv", "cache"],
    "attention": ["core", "platform", "kv"],
    "tokenizer": ["core"],
    "dist": ["core", "platform"],
    "disagg": ["core", "platform", "kv", "dist"],
    "kernels/common": ["core"],
    "kernels/cpu": ["core", "kernels/common"],
    "kernels/cuda": ["core", "kernels/common"],
    "backends": ["core", "platform", "kv", "attention", "kernels"],
    "spec": ["core", "platform", "kv", "cache", "attention"],
    "model": ["core", "platform", "kv", "cache", "attention", "backends", "kernels", "spec",
              "tokenizer", "dist"],
    "engine": ["core", "platform", "kv", "cache", "tier", "attention", "backends", "kernels", "spec",
               "model", "tokenizer", "dist"],
    "grammar": ["core", "tokenizer", "engine"],
    "server": ["core", "platform", "kv", "cache", "tier", "attention", "backends", "kernels", "spec",
               "model", "tokenizer", "engine", "grammar", "dist", "disagg"],
    "cli": ["*"],
    "python": ["*"],
}
# platform/cuda may launch the KV-write kernels it hosts.
EXTRA = {"platform/cuda": ["kernels/cuda", "kernels/common"]}
INCLUDE = re.compile(r'#\s*include\s+"pagoda/([^"]+)"')
GETENV = re.compile(r"\b(secure_)?getenv\s*\(")
# Process-level settings, not kernel or engine switches (docs/design/core.md, cli):
GETENV_ALLOWED = {
    "core/log.cpp",          # PAGODA_LOG_LEVEL: the process's log threshold
    "cli/bench_command.cpp", # OMP_WAIT_POLICY: left as the user set it, else set to passive
}


def module_of(rel: str) -> str:
    parts = rel.split("/")
    if parts[0] in ("kernels",) and len(parts) > 2:
        return "/".join(parts[:2])
    return parts[0]


def allowed(src: str, dst_path: str) -> bool:
    dst = module_of(dst_path)
    if dst == src or dst_path.startswith(src + "/"):
        return True
    rules = ALLOWED.get(src, [])
    if "*" in rules:
        return True
    for rule in rules + [r for k, v in EXTRA.items() for r in v if k == src]:
        if dst == rule or dst.startswith(rule + "/") or dst_path.startswith(rule + "/"):
            return True
    return False


def main() -> int:
    root = pathlib.Path(sys.argv[1]) / "pagoda"
    bad = []
    for f in sorted(root.rglob("*")):
        if f.suffix not in (".h", ".cpp", ".cu", ".cuh"):
            continue
        rel = f.relative_to(root).as_posix()
        src = module_of(rel)
        if rel.startswith("platform/cuda/"):
            src = "platform/cuda"
            ok_extra = EXTRA["platform/cuda"] + ALLOWED["platform"] + ["platform"]
        for line_no, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            if GETENV.search(line) and rel not in GETENV_ALLOWED:
                bad.append(f"{rel}:{line_no}: reads the environment (use typed configuration; "
                           "process-level exceptions: GETENV_ALLOWED in tools/check_layering.py)")
            m = INCLUDE.search(line)
            if not m:
                continue
            target = m.group(1)
            if src == "platform/cuda":
                ok = any(module_of(target) == r or target.startswith(r + "/") for r in ok_extra)
            else:
                ok = allowed(src, target)
            if not ok:
                bad.append(f"{rel}:{line_no}: module '{src}' may not include 'pagoda/{target}'")
    for b in bad:
        print(b)
    print(f"layering: {len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
