#!/usr/bin/env python3
"""Unit test of tools/sass_diff.py's listing parser on a canned `cuobjdump -sass` excerpt (the
comparison itself needs nvcc and cuobjdump, which CI lacks): kernels split at their `Function`
lines, addresses and encodings dropped, the anonymous-namespace path hash removed from names, and
--loose folding register numbers and immediates. Exit 1 on a failed check."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_diff import parse_sass  # noqa: E402

LISTING = """
\tcode for sm_90a
\t\tFunction : _ZN6pagoda7kernels4cuda6detail43_GLOBAL__N__7a8c8a09_10_generic_cu_a5063e1112merge_kernelE
\t.headerflags\t@"EF_CUDA_TEXMODE_UNIFIED"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                          /* 0x00000a00ff017b82 */
                                                                                   /* 0x000fe20000000800 */
        /*0010*/                   S2R R15, SR_TID.X ;                             /* 0x0000000000007919 */
        /*0020*/              @!P0 BRA 0x7db0 ;                                    /* 0x0000000000008947 */
\t\tFunction : _ZN6pagoda7kernels4cuda6detail14other_kernelE
        /*0000*/                   HGMMA.64x16x16.F32.BF16 R24, gdesc[UR20], RZ, !UPT ;  /* 0x00e0000014187df0 */
"""


def main() -> int:
    k = parse_sass(LISTING, loose=False)
    merge = "_ZN6pagoda7kernels4cuda6detail43_GLOBAL__N__10_generic_cu_a5063e1112merge_kernelE"
    checks = [
        (sorted(k) == sorted([merge, "_ZN6pagoda7kernels4cuda6detail14other_kernelE"]),
         f"kernel names {sorted(k)}"),
        (k.get(merge) == ["LDC R1, c[0x0][0x28]", "S2R R15, SR_TID.X", "@!P0 BRA 0x7db0"],
         f"merge instructions {k.get(merge)}"),
        (k.get("_ZN6pagoda7kernels4cuda6detail14other_kernelE") ==
         ["HGMMA.64x16x16.F32.BF16 R24, gdesc[UR20], RZ, !UPT"], "HGMMA line"),
    ]
    loose = parse_sass(LISTING, loose=True)
    checks.append((loose.get(merge) == ["LDC R, c[0x][0x]", "S2R R, SR_TID.X", "@!P BRA 0x"],
                   f"loose {loose.get(merge)}"))
    bad = [what for ok, what in checks if not ok]
    for what in bad:
        print("FAIL", what)
    print("ok" if not bad else f"{len(bad)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
