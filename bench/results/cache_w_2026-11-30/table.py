import json, re, glob, sys, os
R = sys.argv[1] if len(sys.argv) > 1 else '/tmp/results'
PH = ['P1_insert', 'P2_match_full', 'P3_match_partial', 'P4a_evict_half', 'P4b_evict_2048']
def num(v):
    m = {'k': 1e3, 'm': 1e-3, 'u': 1e-6, 'M': 1e6, 'G': 1e9}
    return float(v[:-1]) * m[v[-1]] if v[-1] in m else float(v)
def pagoda(kind):  # kind: after / before
    best = {}
    for f in sorted(glob.glob(f'{R}/pagoda_{kind}_r*.log')):
        for line in open(f):
            mm = re.match(r'(W_\w+)/(\d+)/\S*manual_time_min\s', line)
            if not mm: continue
            key = (mm.group(1), int(mm.group(2)))
            c = dict((k, num(v)) for k, v in re.findall(r'(\w+)=(\S+)', line))
            d = best.setdefault(key, {})
            for k, v in c.items():
                if k.endswith('_us'): d[k] = min(d.get(k, 1e30), v)
                else: d[k] = v
    return best
def sglang(page):
    best = None
    for f in sorted(glob.glob(f'{R}/sglang_p{page}_r*.json')):
        j = json.load(open(f))
        us = j['best_us_per_op']
        best = us if best is None else [min(a, b) for a, b in zip(best, us)]
    return best
after, before = pagoda('after'), pagoda('before')
out = []
for page in (1, 16):
    s = sglang(page)
    out.append(f'page {page}')
    for i, ph in enumerate(PH):
        k = ph + '_us'
        row = [ph, f'{s[i]:.1f}' if s else '-']
        for kind, src in (('before', before), ('after', after)):
            for a in ('W_real_allocator', 'W_counting_pages'):
                v = src.get((a, page), {}).get(k)
                row.append(f'{v:.2f}' if v is not None else '-')
                if v and s: row.append(f'{s[i]/v:.1f}x')
        out.append(' | '.join(row))
    for a in ('W_real_allocator', 'W_counting_pages'):
        d = after.get((a, page), {})
        out.append(f"  after {a}: allocs/op " + ', '.join(f"{ph}={d.get(ph+'_allocs', float('nan')):.3g}" for ph in PH) +
                   f"; B/token {d.get('tree_bytes_per_token', float('nan')):.2f}; MiB after evict {d.get('heap_MiB_after_evict', float('nan')):.2f}")
        d = before.get((a, page), {})
        if d:
            out.append(f"  before {a}: allocs/op " + ', '.join(f"{ph}={d.get(ph+'_allocs', float('nan')):.3g}" for ph in PH) +
                       f"; B/token {d.get('tree_bytes_per_token', float('nan')):.2f}; MiB after evict {d.get('heap_MiB_after_evict', float('nan')):.2f}")
print('\n'.join(out))
