"""CPU check of mla_widen_stage's in-place e4m3 -> bf16 widening (mla_decode_sm90_kernel.cuh):
the raw tile [5 cols][64 rows][128 B] (128B swizzle) at stage offset 32,768 becomes the bf16 tile
[9 cols][64 rows][128 B] at offset 0. Replays every thread's reads and writes, with the exact
address formulas of the kernel, phase by phase (phases split by the producer's named barriers;
inside a phase the threads run in any order), and checks (1) no byte is written in a phase in
which any thread reads it, or before a later phase reads it, (2) every byte read holds the raw
byte it should, (3) the final layout holds every latent element, widened, where the consumers'
wgmma descriptors read it; plus the cp.async gather's row offsets (so_even / odd groups)."""
import random

KOFF, KCOL, TILE = 32768, 8192, 73728


def sw128(r, c):
    return r * 128 + ((c ^ (r & 7)) << 4)


def main():
    rng = random.Random(20261204)
    lat = [[rng.randrange(256) for _ in range(576)] for _ in range(64)]  # e4m3 bytes [row][dim]
    mem = [None] * TILE
    # TMA / gather layout of the raw tile: column a holds dims 128a..128a+127 of each row.
    for r in range(64):
        for a in range(5):
            for c in range(8):
                for e in range(16):
                    d = 128 * a + 16 * c + e
                    mem[KOFF + a * KCOL + sw128(r, c) + e] = ("raw", r, d) if d < 576 else ("zero",)
    phases = [[(0, "r"), (0, "w"), (1, "r"), (1, "w")], [(2, "r"), (2, "w"), (3, "r")],
              [(3, "w"), (4, "r")], [(4, "w")]]
    reads_left = {}  # byte -> number of reads still to come (for the write-before-read check)
    plan = []
    for ph in phases:
        ops = []
        for t in range(128):
            r, c = t >> 3, t & 7
            rd = KOFF + sw128(r, c)
            wr = (c >> 2) * KCOL + sw128(r, 2 * (c & 3))
            for at, kind in ph:
                if at == 4 and c >= 4:
                    continue
                for k in range(4):
                    if kind == "r":
                        ops.append((t, "r", at, k, rd + at * KCOL + 2048 * k))
                    else:
                        base = wr + 2 * at * KCOL + 2048 * k
                        assert base % 32 in (0, 16) and (base ^ 16) - base in (16, -16)
                        ops.append((t, "w", at, k, base))
                        ops.append((t, "w", at, k, base ^ 16))
        plan.append(ops)
    for ops in plan:
        for t, kind, at, k, addr in ops:
            if kind == "r":
                for e in range(16):
                    reads_left[addr + e] = reads_left.get(addr + e, 0) + 1
    regs = {}
    for pi, ops in enumerate(plan):
        phase_reads = {a + e for t, kind, at, k, a in ops if kind == "r" for e in range(16)}
        for t, kind, at, k, addr in ops:  # reads first: any order inside a phase is allowed
            if kind == "r":
                chunk = [mem[addr + e] for e in range(16)]
                r, c = (t >> 3) + 16 * k, t & 7
                want = [("raw", r, 128 * at + 16 * c + e) for e in range(16)]
                assert chunk == want, (pi, t, at, k, chunk[:2], want[:2])
                regs[(t, at, k)] = chunk
                for e in range(16):
                    reads_left[addr + e] -= 1
        for t, kind, at, k, addr in ops:
            if kind == "w":
                for e in range(16):
                    assert addr + e not in phase_reads, ("write into a byte read in its phase", pi, t)
                    assert reads_left.get(addr + e, 0) == 0, ("write before a later read", pi, t)
        # Replay the writes: each chunk's ops were appended low half (elements 0..7, at `base`)
        # then high half (8..15, at base ^ 16).
        it = iter([o for o in ops if o[1] == "w"])
        for lo_op in it:
            hi_op = next(it)
            t, _, at, k, base = lo_op
            src = regs[(t, at, k)]
            for half, op in ((0, lo_op), (1, hi_op)):
                for j in range(8):
                    el = src[8 * half + j]
                    mem[op[4] + 2 * j] = ("bf16", el)
                    mem[op[4] + 2 * j + 1] = ("bf16", el)
    # Final layout: bf16 column d // 64, row r, chunk (d % 64) // 8, element d % 8.
    for r in range(64):
        for d in range(576):
            col, ch, j = d // 64, (d % 64) // 8, d % 8
            addr = col * KCOL + sw128(r, ch) + 2 * j
            assert mem[addr] == ("bf16", ("raw", r, d)), (r, d, mem[addr])
    # The cp.async gather: lane (sub, c8) of warp w writes row w*16 + 4g + sub, chunk c8.
    for w in range(4):
        for lane in range(32):
            c8, sub = lane % 8, lane // 8
            so_even = sw128(w * 16 + sub, c8)
            for g in range(4):
                d = ((so_even + 512) ^ 64 if g & 1 else so_even) + (g >> 1) * 1024
                assert d == sw128(w * 16 + 4 * g + sub, c8), (w, lane, g)
    print("ok: in-place widening order safe, final bf16 layout exact, gather offsets exact")


main()
