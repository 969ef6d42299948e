"""Prints the tables of bench/results/cache_cpu.md (third session) from the logs in this
directory (or argv[1]): each number is the best (minimum) over every round and repetition, per
side. pagoda_a_r*.log: this branch; before_r*.log: the branch point with the same driver;
sglang_p{1,16}_r*.json: SGLang's harness."""
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


def pagoda(pattern):
    best = {}
    for f in sorted(glob.glob(f'{R}/{pattern}')):
        for line in open(f):
            mm = re.match(r'(W_\w+)(?:/(\d+))?/\S*manual_time_min\s', line)
            if not mm:
                continue
            d = best.setdefault((mm.group(1), int(mm.group(2) or 0)), {})
            for k, v in re.findall(r'(\w+)=(\S+)', line):
                v = num(v)
                low = k.endswith('_us') or k.endswith('_ms') or k.endswith('_ns')
                d[k] = min(d.get(k, 1e30), v) if low else v
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


a, b = pagoda('pagoda_a_r*.log'), pagoda('before_r*.log')
s1, s16 = sglang(1), sglang(16)
rat = lambda s, v: f'{s / v:.1f}×' if s and v else '-'
print('| operation | SGLang p1 / p16 | pagoda, real allocator, p1 / p16 | ratio p1 / p16 '
      '| pagoda, counting pages, p1 / p16 | ratio p1 / p16 |')
print('|---|---|---|---|---|---|')
for i, ph in enumerate(PH):
    g = lambda w, page: a.get((w, page), {}).get(ph + '_us')
    r1, r16 = g('W_real_allocator', 1), g('W_real_allocator', 16)
    c1, c16 = g('W_counting_pages', 1), g('W_counting_pages', 16)
    print(f'| {NAMES[ph]} | {fmt(s1[i], i)} / {fmt(s16[i], i)} | {fmt(r1, i)} / {fmt(r16, i)} '
          f'| **{rat(s1[i], r1)}** / **{rat(s16[i], r16)}** | {fmt(c1, i)} / {fmt(c16, i)} '
          f'| {rat(s1[i], c1)} / {rat(s16[i], c16)} |')
print()
print('| operation, real allocator | before p1 / p16 (wall) | after p1 / p16 (wall) '
      '| before p1 / p16 (CPU) | after p1 / p16 (CPU) |')
print('|---|---|---|---|---|')
for i, ph in enumerate(PH):
    g = lambda d, page, k: d.get(('W_real_allocator', page), {}).get(ph + k)
    print(f"| {NAMES[ph]} | {fmt(g(b, 1, '_us'), i)} / {fmt(g(b, 16, '_us'), i)} "
          f"| {fmt(g(a, 1, '_us'), i)} / {fmt(g(a, 16, '_us'), i)} "
          f"| {fmt(g(b, 1, '_cpu_us'), i)} / {fmt(g(b, 16, '_cpu_us'), i)} "
          f"| {fmt(g(a, 1, '_cpu_us'), i)} / {fmt(g(a, 16, '_cpu_us'), i)} |")
print()
for name, d in (('after', a), ('before', b)):
    for w in ('W_real_allocator', 'W_counting_pages'):
        for page in (1, 16):
            e = d.get((w, page), {})
            print(f'{name} {w}/{page}: allocs/op ' +
                  ', '.join(f"{ph}={e.get(ph + '_allocs', float('nan')):.3g}" for ph in PH) +
                  '; cpu µs/op ' +
                  ', '.join(f"{ph}={e.get(ph + '_cpu_us', float('nan')):.3g}" for ph in PH) +
                  f"; P2_hot {e.get('P2_hot_us', float('nan')):.3g} µs wall / "
                  f"{e.get('P2_hot_cpu_us', float('nan')):.3g} µs CPU"
                  f"; P1_timer_ns {e.get('P1_timer_ns', float('nan')):.3g}"
                  f"; B/token {e.get('tree_bytes_per_token', float('nan')):.2f}"
                  f"; MiB after evict {e.get('heap_MiB_after_evict', float('nan')):.2f}")
    f = d.get(('W_floor_refcounts', 0), {})
    print(f"{name} W_floor_refcounts: counts {f.get('counts_ms', float('nan')):.3g} ms wall / "
          f"{f.get('counts_cpu_ms', float('nan')):.3g} ms CPU; counts + stack "
          f"{f.get('counts_and_stack_ms', float('nan')):.3g} ms wall / "
          f"{f.get('counts_and_stack_cpu_ms', float('nan')):.3g} ms CPU")
loads = []
for fn in sorted(glob.glob(f'{R}/*_r*.log')):
    m = re.search(r'load average: ([\d.]+)', open(fn).read())
    if m:
        loads.append(float(m.group(1)))
if loads:
    print(f'load average (1 min) at the start of each run: {min(loads)} - {max(loads)}')
