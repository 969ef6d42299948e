import sys
sys.argv = sys.argv[:2]
exec(open(__file__.replace('table_md.py', 'table.py')).read().split("after, before = pagoda('after'), pagoda('before')")[0])
after, before = pagoda('after'), pagoda('before')
names = {'P1_insert': 'insert (P1, per sequence)', 'P2_match_full': 'match, full hit (P2, 2,304-token query)',
         'P3_match_partial': 'match, partial hit (P3, ~1,024 hit)', 'P4a_evict_half': 'evict half the tree, one call (P4a)',
         'P4b_evict_2048': 'evict 2,048 tokens until empty (P4b, per call)'}
s1, s16 = sglang(1), sglang(16)
def fmt(v, i):
    if v is None: return '-'
    if i == 3: return f'{v/1000:.1f} ms'
    return f'{v:.2f} µs' if v < 10 else f'{v:.1f} µs'
print('| operation | SGLang p1 / p16 | pagoda before, p1 / p16 | pagoda after, real allocator, p1 / p16 | ratio p1 / p16 | pagoda after, counting pages, p1 / p16 | ratio p1 / p16 |')
print('|---|---|---|---|---|---|---|')
for i, ph in enumerate(PH):
    k = ph + '_us'
    g = lambda src, a, p: src.get((a, p), {}).get(k)
    b1, b16 = g(before, 'W_real_allocator', 1), g(before, 'W_real_allocator', 16)
    r1, r16 = g(after, 'W_real_allocator', 1), g(after, 'W_real_allocator', 16)
    c1, c16 = g(after, 'W_counting_pages', 1), g(after, 'W_counting_pages', 16)
    rat = lambda s, v: f'{s/v:.1f}×' if s and v else '-'
    print(f'| {names[ph]} | {fmt(s1[i], i)} / {fmt(s16[i], i)} | {fmt(b1, i)} / {fmt(b16, i)} ({rat(s1[i], b1)} / {rat(s16[i], b16)}) | '
          f'{fmt(r1, i)} / {fmt(r16, i)} | **{rat(s1[i], r1)}** / **{rat(s16[i], r16)}** | {fmt(c1, i)} / {fmt(c16, i)} | {rat(s1[i], c1)} / {rat(s16[i], c16)} |')
