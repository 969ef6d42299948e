"""CPU check of the widened split-KV merge's work split (generic.cu merge_row / PartialSum):
replays every thread's (group, partial subset) assignment and the shared-memory reduction with
the kernel's index formulas and checks that each output column receives every partial's
contribution exactly once, for the block sizes merge_threads() picks and both group widths."""


def merge_threads(d):
    t = ((d + 3) // 4 * 4 + 31) // 32 * 32
    return max(128, min(512, t))


def run(D, np_, vec, threads):
    W = 4 if vec else 1
    groups = D // W
    C = min(groups, threads)
    S = threads // C
    out = {}
    for g0 in range(0, groups, C):
        acc = {}
        for t in range(threads):
            c, sub = t % C, t // C
            summing = sub < S
            g = g0 + c
            a = [0] * 4
            if summing and g < groups:
                p = sub
                while p < np_:
                    for u in range(4):
                        q = p + u * S
                        if q < np_:
                            for k in range(W):
                                a[k] += 1 << q  # a bit per partial: sums must be 2^np - 1
                    p += 4 * S
            acc[t] = a
        red = {t: acc[t] for t in range(threads) if t // C < S} if S > 1 else {}
        for t in range(threads):
            c, sub = t % C, t // C
            g = g0 + c
            if sub == 0 and g < groups:
                a = list(acc[t])
                if S > 1:
                    for k in range(1, S):
                        v = red[k * C + c]
                        a = [x + y for x, y in zip(a, v)]
                for k in range(W):
                    col = g * W + k
                    assert col not in out, ("column stored twice", D, np_, col)
                    out[col] = a[k]
    assert sorted(out) == list(range(D)), (D, np_, vec, "columns missing")
    assert all(v == (1 << np_) - 1 for v in out.values()), (D, np_, vec, threads)


for D in (64, 128, 256, 512, 96, 80, 130, 7):
    for np_ in (1, 2, 3, 5, 16, 17, 64, 100):
        for vec in ((True, False) if D % 4 == 0 else (False,)):
            run(D, np_, vec, merge_threads(D))
            run(D, np_, vec, 512)
print("ok: every column gets each partial exactly once")
