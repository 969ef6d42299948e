#!/usr/bin/env python3
"""Unit test of tools/ncu_lines.py on a canned `nvdisasm -gi` listing and a canned ncu export (the
tool itself needs nvcc and nvdisasm, which CI lacks): location chains innermost first, the
function whose opcodes match the export's picked (guard predicates ignored, a one-opcode
difference rejected), and the report's per-class shares of samples and executed instructions
and its --grep share. Exit 1 on a failed check."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_lines import match_function, parse_listing, read_export, report  # noqa: E402

LISTING = """
.text._Z5otherv:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
.text._Z6kernelv:
\t//## File "/x/src/k.cuh", line 7
        /*0000*/                   LDC R1, c[0x0][0x28] ;
\t//## File "/x/src/h.cuh", line 3 inlined at "/x/src/k.cuh", line 9
\t//## File "/x/src/k.cuh", line 9
        /*0010*/                   IABS R0, R2 ;
        /*0020*/              @!P0 BRA 0x40 ;
\t//## File "/x/src/k.cuh", line 12
        /*0030*/                   EXIT ;
"""

EXPORT = '''"Kernel Name","void kernel()"
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed"
"0x0","      LDC R1, c[0x0][0x28]","10","100"
"0x10","      IABS R0, R2","30","400"
"0x20","@!P0  BRA 0x40","20","400"
"0x30","      EXIT","40","100"
'''


class FakeSources:
    def text(self, base, line):
        return {("h.cuh", 3): "q = x / G;", ("k.cuh", 9): "f(x);"}.get((base, line), "")


def main() -> int:
    funcs = parse_listing(LISTING)
    k = funcs.get("_Z6kernelv", [])
    checks = [
        (sorted(funcs) == ["_Z5otherv", "_Z6kernelv"], f"functions {sorted(funcs)}"),
        ([c for _, c in k] == [(("k.cuh", 7),), (("h.cuh", 3), ("k.cuh", 9)),
                               (("h.cuh", 3), ("k.cuh", 9)), (("k.cuh", 12),)],
         f"chains {[c for _, c in k]}"),
    ]
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write(EXPORT)
    try:
        name, rows = read_export(f.name)
    finally:
        os.unlink(f.name)
    checks.append((name == "void kernel()" and len(rows) == 4 and rows[1]["executed"] == 400,
                   f"export {name} {rows}"))
    found = match_function(funcs, rows)
    checks.append((found is not None and found[0] == "_Z6kernelv", f"match {found and found[0]}"))
    bad_rows = [dict(r) for r in rows]
    bad_rows[1]["sass"] = "IMAD R0, R2, R3, RZ"
    checks.append((match_function(funcs, bad_rows) is None, "a different opcode matched"))
    text = report(rows, found[1] if found else [], FakeSources(), 2, 4, r"/ G\b")
    checks += [
        ("executed       400 times:     2 instructions,  50.0 % of samples,  80.0 % of executed"
         in text, "class 400"),
        ("lines matching '/ G\\\\b': 50.0 % of samples, 80.0 % of executed" in text, "grep share"),
        ("h.cuh:3 @ k.cuh:9" in text, "inlined line named with its kernel line"),
    ]
    bad = [what for ok, what in checks if not ok]
    for what in bad:
        print("FAIL", what)
    if bad:
        print(text)
    print("ok" if not bad else f"{len(bad)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
