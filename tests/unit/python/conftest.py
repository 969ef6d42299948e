"""Shared fixtures and the independent reference for the Python package's tests.

The reference is plain NumPy float64 attention written from the math (FlashInfer's conventions:
bottom-right causal, window_left keeps window_left + 1 keys, soft cap cap * tanh(x / cap) on the
scaled logit, LSE base 2), separate from the code under test. Every test draws its inputs from a
seeded generator and prints the seed."""
import numpy as np
import pytest


@pytest.fixture
def rng(request):
    seed = int(np.random.SeedSequence().entropy % (2**31))
    print(f"{request.node.name}: seed {seed}")
    return np.random.default_rng(seed)


def bf16_bits(x):
    """float -> bf16 bits (uint16), round to nearest even (test-side conversion)."""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def quantize(x, dtype):
    """(storage array, its float64 value) for dtype 'float32' / 'float16' / 'bfloat16'."""
    if dtype == "bfloat16":
        bits = bf16_bits(x)
        return bits, bf16_value(bits).astype(np.float64)
    a = x.astype(dtype)
    return a, a.astype(np.float64)


def value(a):
    """float64 values of a storage array (uint16 = bf16 bits)."""
    return bf16_value(a).astype(np.float64) if a.dtype == np.uint16 else a.astype(np.float64)


TOL = {"float32": 2e-4, "float16": 2e-2, "bfloat16": 6e-2}


def reference(q, k, v, *, causal, sm_scale, window_left=-1, soft_cap=0.0, mask=None):
    """One request: q [qo, Hq, D], k [kv, Hkv, D], v [kv, Hkv, Dv] (float64); mask bool
    [qo, kv] replaces causal. Returns (out [qo, Hq, Dv], lse base 2 [qo, Hq]); a row that sees no
    key gets out 0 and lse -inf."""
    qo, hq, _ = q.shape
    kv, hkv, dv = v.shape
    group = hq // hkv
    kk = np.repeat(k, group, axis=1)
    vv = np.repeat(v, group, axis=1)
    s = np.einsum("qhd,khd->hqk", q, kk) * sm_scale
    if soft_cap > 0:
        s = soft_cap * np.tanh(s / soft_cap)
    i = np.arange(qo)[:, None] + kv - qo
    j = np.arange(kv)[None, :]
    visible = np.ones((qo, kv), bool)
    if mask is not None:
        visible = mask.copy()
    elif causal:
        visible &= j <= i
    if window_left >= 0:
        visible &= j >= i - window_left
    s = np.where(visible[None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    denom = p.sum(-1, keepdims=True)
    out = np.einsum("hqk,khd->qhd", p / np.where(denom > 0, denom, 1.0), vv)
    with np.errstate(divide="ignore"):
        lse = ((np.log(denom[..., 0]) + m[..., 0]) / np.log(2.0)).T
    lse = np.where(denom[..., 0].T > 0, lse, -np.inf)
    return out, lse


class PagedCache:
    """A random paged KV cache: pages handed out in shuffled order, partial last pages, unused
    pages and slots poisoned with NaN, NHD or HND storage in one dtype."""

    def __init__(self, rng, kv_lens, page_size, hkv, dqk, dv, dtype, layout, spare_pages=3):
        pages_per = [(n + page_size - 1) // page_size for n in kv_lens]
        total = sum(pages_per) + spare_pages
        order = rng.permutation(total).astype(np.int32)
        self.indptr = np.concatenate([[0], np.cumsum(pages_per)]).astype(np.int32)
        self.indices = order[: self.indptr[-1]]
        self.last_page_len = np.array(
            [n - (p - 1) * page_size if p else 0 for n, p in zip(kv_lens, pages_per)], np.int32)
        k = np.full((total, page_size, hkv, dqk), np.nan, np.float32)
        v = np.full((total, page_size, hkv, dv), np.nan, np.float32)
        self.k_ref, self.v_ref = [], []
        for b, n in enumerate(kv_lens):
            kb, kval = quantize(rng.standard_normal((n, hkv, dqk)).astype(np.float32), dtype)
            vb, vval = quantize(rng.standard_normal((n, hkv, dv)).astype(np.float32), dtype)
            self.k_ref.append(kval)
            self.v_ref.append(vval)
            for t in range(n):
                page = self.indices[self.indptr[b] + t // page_size]
                k[page, t % page_size] = value(kb[t:t + 1])[0]
                v[page, t % page_size] = value(vb[t:t + 1])[0]
        ks, _ = quantize(k, dtype)
        vs, _ = quantize(v, dtype)
        if dtype == "bfloat16":  # NaN survives the bit conversion as a NaN pattern
            assert np.isnan(bf16_value(ks[np.isnan(k)])).all()
        if layout == "HND":
            ks = np.ascontiguousarray(ks.transpose(0, 2, 1, 3))
            vs = np.ascontiguousarray(vs.transpose(0, 2, 1, 3))
        self.k, self.v = ks, vs


def poisoned_out(shape, dtype):
    """An output buffer full of NaN in the storage dtype."""
    a, _ = quantize(np.full(shape, np.nan, np.float32), dtype)
    return a


def assert_close(got, want, dtype, what):
    g = value(got)
    assert np.isfinite(g).all(), f"{what}: non-finite values in the output"
    err = np.abs(g - want).max() if g.size else 0.0
    scale = max(1.0, np.abs(want).max() if want.size else 1.0)
    assert err <= TOL[dtype] * scale, f"{what}: max abs error {err} > {TOL[dtype] * scale}"


def assert_lse_close(got, want, what, tol=2e-3):
    got = np.asarray(got, np.float64)
    assert np.array_equal(np.isneginf(got), np.isneginf(want)), f"{what}: -inf pattern differs"
    fin = np.isfinite(want)
    err = np.abs(got[fin] - want[fin]).max() if fin.any() else 0.0
    assert err <= tol * max(1.0, np.abs(want[fin]).max() if fin.any() else 1.0), \
        f"{what}: lse error {err}"
