"""Prints the markdown table of bench/results/cache_cpu.md from the logs in this directory (or
argv[1]): for each row the best (minimum) time over every round and repetition, per side."""
import glob, json, os, re, sys

R = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
PH = ['P1_insert', 'P2_match_full', 'P3_match_partial', 'P4a_evict_half', 'P4b_evict_2048']
NAMES = {'P1_insert': 'insert (P1, per sequence)',
         'P2_match_full': 'match, full hit (P2, 2,304-token query)',
         'P3_match_partial': 'match, partial hit (P3, ~1,024 hit)',
         'P4a_evict_half': 'evict half the tree, one call (P4a)',
         'P4b_evict_2048': 'evict 2,048 tokens until empty (P4b, per call)'}


def num(v):
    m = {'k': 1e3, 'm': 1e-3, 'u': 1e-6, 'n': 1e-9, 'M': 1e6, 'G': 1e9}
    return float(v[:-1]) * m[v[-1]] if v[-1] in m else float(v)


def pagoda():
    best = {}
    for f in sorted(glob.glob(f'{R}/pagoda_[ab]_r*.log')):
        for line in open(f):
            mm = re.match(r'(W_\w+)/(\d+)/\S*manual_time_min\s', line)
            if not mm:
                continue
            d = best.setdefault((mm.group(1), int(mm.group(2))), {})
            for k, v in re.findall(r'(\w+)=(\S+)', line):
                v = num(v)
                d[k] = min(d.get(k, 1e30), v) if k.endswith('_us') else v
    return best


def sglang(page):
    best = None
    for f in sorted(glob.glob(f'{R}/sglang_p{page}_r*.json')):
        us = json.load(open(f))['best_us_per_op']
        best = us if best is None else [min(a, b) for a, b in zip(best, us)]
    return best


def fmt(v, i):
    if v is None:
        return '-'
    if i == 3:
        return f'{v / 1000:.2f} ms'
    return f'{v:.2f} µs' if v < 10 else f'{v:.1f} µs'


p = pagoda()
s1, s16 = sglang(1), sglang(16)
print('| operation | SGLang p1 / p16 | pagoda, real allocator, p1 / p16 | ratio p1 / p16 '
      '| pagoda, counting pages, p1 / p16 | ratio p1 / p16 |')
print('|---|---|---|---|---|---|')
for i, ph in enumerate(PH):
    g = lambda a, page: p.get((a, page), {}).get(ph + '_us')
    r1, r16 = g('W_real_allocator', 1), g('W_real_allocator', 16)
    c1, c16 = g('W_counting_pages', 1), g('W_counting_pages', 16)
    rat = lambda s, v: f'{s / v:.1f}×' if s and v else '-'
    print(f'| {NAMES[ph]} | {fmt(s1[i], i)} / {fmt(s16[i], i)} | {fmt(r1, i)} / {fmt(r16, i)} '
          f'| **{rat(s1[i], r1)}** / **{rat(s16[i], r16)}** | {fmt(c1, i)} / {fmt(c16, i)} '
          f'| {rat(s1[i], c1)} / {rat(s16[i], c16)} |')
print()
for a in ('W_real_allocator', 'W_counting_pages'):
    for page in (1, 16):
        d = p.get((a, page), {})
        print(f'{a}/{page}: allocs/op ' +
              ', '.join(f"{ph}={d.get(ph + '_allocs', float('nan')):.3g}" for ph in PH) +
              f"; cpu µs/op " + ', '.join(f"{ph}={d.get(ph + '_cpu_us', float('nan')):.3g}" for ph in PH) +
              f"; B/token {d.get('tree_bytes_per_token', float('nan')):.2f}"
              f"; MiB after evict {d.get('heap_MiB_after_evict', float('nan')):.2f}")
