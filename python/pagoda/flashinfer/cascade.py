"""FlashInfer's merge_state / merge_state_in_place / merge_states: combining attention states
(o, lse) computed over disjoint key sets. LSEs are base 2 (as pagoda's and FlashInfer's kernels
return them): s = log2(2^s_a + 2^s_b), v = (2^(s_a - s) v_a + 2^(s_b - s) v_b). A state whose lse
is -inf contributes nothing; if every state is -inf the result is v = 0, s = -inf. Math in f32 in
the inputs' framework and on their device."""
from pagoda import _arrays as A


def _check(v, s, name_v, name_s, lead):
    if v.ndim != lead + 2 or s.ndim != lead + 1 or tuple(v.shape[:-1]) != tuple(s.shape):
        raise ValueError(f"{name_v} {tuple(v.shape)} and {name_s} {tuple(s.shape)}: expected "
                         f"v [..., num_heads, head_dim] and s [..., num_heads]")
    if not A.matches(s, "f32"):
        raise ValueError(f"{name_s} must be float32, got {A.dtype_name(s)}")


def _merge(xp, v, s):
    """Merges along dim 1 of v [n, S, H, D] / s [n, S, H] (f32)."""
    numpy = xp.__name__ == "numpy"
    m = s.max(1) if numpy else s.amax(dim=1)
    m0 = xp.where(xp.isneginf(m), xp.zeros_like(m), m)
    w = xp.exp2(s - m0[:, None])
    total = w.sum(1)
    num = (w[..., None] * v).sum(1)
    safe = xp.where(total > 0, total, xp.ones_like(total))
    return num / safe[..., None], xp.where(total > 0, m0 + xp.log2(safe), m)


def merge_state(v_a, s_a, v_b, s_b):
    """v_a, v_b [seq_len, num_heads, head_dim]; s_a, s_b [seq_len, num_heads] f32. Returns
    (v [seq_len, num_heads, head_dim] in v_a's dtype, s [seq_len, num_heads] f32)."""
    _check(v_a, s_a, "v_a", "s_a", 1)
    _check(v_b, s_b, "v_b", "s_b", 1)
    if tuple(v_a.shape) != tuple(v_b.shape):
        raise ValueError(f"v_a {tuple(v_a.shape)} and v_b {tuple(v_b.shape)} differ")
    xp = A.xp(v_a)
    v = xp.stack([A.to_f32(v_a), A.to_f32(v_b)], 1)
    s = xp.stack([s_a, s_b], 1)
    out, lse = _merge(xp, v, s)
    return A.from_f32(out, v_a), lse


def merge_state_in_place(v, s, v_other, s_other, mask=None):
    """Merges (v_other, s_other) into (v, s) in place; mask [seq_len] bool limits the rows."""
    mv, ms = merge_state(v, s, v_other, s_other)
    if mask is not None:
        xp = A.xp(v)
        mv = xp.where(mask[:, None, None], mv, v)
        ms = xp.where(mask[:, None], ms, s)
    v[...] = mv
    s[...] = ms


def merge_states(v, s):
    """v [seq_len, num_states, num_heads, head_dim]; s [seq_len, num_states, num_heads] f32.
    Returns (v [seq_len, num_heads, head_dim] in v's dtype, s [seq_len, num_heads] f32)."""
    _check(v, s, "v", "s", 2)
    out, lse = _merge(A.xp(v), A.to_f32(v), s)
    return A.from_f32(out, v), lse
