"""pagoda.flashinfer on NumPy arrays (CPU kernels) against conftest.reference."""
import math

import numpy as np
import pytest

import pagoda.flashinfer as flashinfer
from conftest import (PagedCache, assert_close, assert_lse_close, poisoned_out, quantize,
                      reference)

DTYPES = ["float32", "float16", "bfloat16"]
WORKSPACE = np.zeros(16 << 20, np.uint8)


def _random_q(rng, n, hq, d, dtype):
    return quantize(rng.standard_normal((n, hq, d)).astype(np.float32), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_batch_decode(rng, dtype, page_size, layout):
    hq, hkv, d = 8, 2, 128
    kv_lens = [int(x) for x in rng.integers(1, 300, size=6)] + [16 * 3, 1]
    cache = PagedCache(rng, kv_lens, page_size, hkv, d, d, dtype, layout)
    window = int(rng.integers(0, 64)) if rng.random() < 0.5 else -1
    cap = 30.0 if rng.random() < 0.5 else None
    sm_scale = 0.7 / math.sqrt(d)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        WORKSPACE, layout, use_tensor_cores=bool(rng.random() < .5))
    wrapper.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hkv, d, page_size,
                 window_left=window, logits_soft_cap=cap, q_data_type=dtype, sm_scale=sm_scale)
    q, qval = _random_q(rng, len(kv_lens), hq, d, dtype)
    out = poisoned_out((len(kv_lens), hq, d), dtype)
    got, lse = wrapper.run(q, (cache.k, cache.v), out=out, return_lse=True)
    assert got is out
    for b in range(len(kv_lens)):
        want, want_lse = reference(qval[b:b + 1], cache.k_ref[b], cache.v_ref[b], causal=True,
                                   sm_scale=sm_scale, window_left=window, soft_cap=cap or 0.0)
        assert_close(got[b:b + 1], want, dtype, f"request {b} (kv_len {kv_lens[b]})")
        assert_lse_close(lse[b:b + 1], want_lse, f"request {b}")


def test_batch_decode_single_5d_cache_and_default_out(rng):
    hq, hkv, d, page_size = 4, 4, 64, 16
    kv_lens = [40, 17, 1]
    cache = PagedCache(rng, kv_lens, page_size, hkv, d, d, "float16", "NHD")
    kv = np.stack([cache.k, cache.v], axis=1)  # [pages, 2, page_size, Hkv, D]
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    wrapper.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hkv, d, page_size)
    q, qval = _random_q(rng, 3, hq, d, "float16")
    got = wrapper.run(q, kv)
    assert got.dtype == np.float16 and got.shape == (3, hq, d)
    for b in range(3):
        want, _ = reference(qval[b:b + 1], cache.k_ref[b], cache.v_ref[b], causal=True,
                            sm_scale=1 / math.sqrt(d))
        assert_close(got[b:b + 1], want, "float16", f"request {b}")


def _prefill_case(rng, page_size, qo_kv):
    qo_lens = [qo for qo, _ in qo_kv]
    kv_lens = [kv for _, kv in qo_kv]
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    return qo_lens, kv_lens, qo_indptr


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("feature", ["causal", "noncausal", "window", "softcap", "mask",
                                     "packed_mask"])
def test_batch_prefill_paged(rng, dtype, page_size, layout, feature):
    hq, hkv, d = 8, 2, 64
    qo_kv = [(int(q), int(q + rng.integers(0, 120))) for q in rng.integers(1, 60, size=4)]
    qo_kv.append((1, 33))
    qo_lens, kv_lens, qo_indptr = _prefill_case(rng, page_size, qo_kv)
    cache = PagedCache(rng, kv_lens, page_size, hkv, d, d, dtype, layout)
    causal = feature != "noncausal"
    window = int(rng.integers(0, 40)) if feature == "window" else -1
    cap = 20.0 if feature == "softcap" else None
    masks = None
    kwargs = {}
    if feature in ("mask", "packed_mask"):
        masks = [rng.random((qo, kv)) < 0.6 for qo, kv in qo_kv]
        flat = np.concatenate([m.reshape(-1) for m in masks])
        if feature == "mask":
            kwargs["custom_mask"] = flat
        else:
            bits_indptr = np.concatenate([[0], np.cumsum([m.size for m in masks])])
            kwargs["packed_custom_mask"], _ = flashinfer.segment_packbits(flat, bits_indptr,
                                                                          bitorder="little")
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(WORKSPACE, layout)
    wrapper.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, hq, hkv, d,
                 page_size, causal=causal, window_left=window, logits_soft_cap=cap,
                 q_data_type=dtype, **kwargs)
    q, qval = _random_q(rng, int(qo_indptr[-1]), hq, d, dtype)
    out = poisoned_out((int(qo_indptr[-1]), hq, d), dtype)
    got, lse = wrapper.run(q, (cache.k, cache.v), out=out, return_lse=True)
    for b in range(len(qo_kv)):
        s, e = qo_indptr[b], qo_indptr[b + 1]
        want, want_lse = reference(qval[s:e], cache.k_ref[b], cache.v_ref[b], causal=causal,
                                   sm_scale=1 / math.sqrt(d), window_left=window,
                                   soft_cap=cap or 0.0,
                                   mask=None if masks is None else masks[b])
        assert_close(got[s:e], want, dtype, f"request {b} {qo_kv[b]}")
        assert_lse_close(lse[s:e], want_lse, f"request {b}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_batch_prefill_ragged(rng, dtype, layout):
    hq, hkv, dqk, dv = 6, 3, 64, 32
    qo_kv = [(int(q), int(q + rng.integers(0, 80))) for q in rng.integers(1, 50, size=5)]
    qo_lens, kv_lens, qo_indptr = _prefill_case(rng, 1, qo_kv)
    kv_indptr = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
    k, kval = quantize(rng.standard_normal((int(kv_indptr[-1]), hkv, dqk)).astype(np.float32),
                       dtype)
    v, vval = quantize(rng.standard_normal((int(kv_indptr[-1]), hkv, dv)).astype(np.float32),
                       dtype)
    q, qval = _random_q(rng, int(qo_indptr[-1]), hq, dqk, dtype)
    wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE, layout)
    wrapper.plan(qo_indptr, kv_indptr, hq, hkv, dqk, head_dim_vo=dv, causal=True,
                 q_data_type=dtype)
    kin, vin = (k, v) if layout == "NHD" else (np.ascontiguousarray(k.transpose(1, 0, 2)),
                                                np.ascontiguousarray(v.transpose(1, 0, 2)))
    got, lse = wrapper.run(q, kin, vin, return_lse=True)
    assert got.shape == (int(qo_indptr[-1]), hq, dv)
    for b in range(len(qo_kv)):
        s, e = qo_indptr[b], qo_indptr[b + 1]
        ks, ke = kv_indptr[b], kv_indptr[b + 1]
        want, want_lse = reference(qval[s:e], kval[ks:ke], vval[ks:ke], causal=True,
                                   sm_scale=1 / math.sqrt(dqk))
        assert_close(got[s:e], want, dtype, f"request {b}")
        assert_lse_close(lse[s:e], want_lse, f"request {b}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_single_decode_and_prefill(rng, dtype, layout):
    hq, hkv, d, kv_len, qo_len = 8, 1, 128, 257, 40
    k, kval = quantize(rng.standard_normal((kv_len, hkv, d)).astype(np.float32), dtype)
    v, vval = quantize(rng.standard_normal((kv_len, hkv, d)).astype(np.float32), dtype)
    kin, vin = (k, v) if layout == "NHD" else (k.transpose(1, 0, 2), v.transpose(1, 0, 2))
    q, qval = _random_q(rng, qo_len, hq, d, dtype)
    out, lse = flashinfer.single_decode_with_kv_cache(q[0], kin, vin, kv_layout=layout,
                                                      window_left=100, logits_soft_cap=15.0,
                                                      return_lse=True)
    want, want_lse = reference(qval[:1], kval, vval, causal=True, sm_scale=1 / math.sqrt(d),
                               window_left=100, soft_cap=15.0)
    assert out.shape == (hq, d) and lse.shape == (hq,)
    assert_close(out[None], want, dtype, "single decode")
    assert_lse_close(lse[None], want_lse, "single decode")
    mask = rng.random((qo_len, kv_len)) < 0.5
    for kwargs, ref_kw in (({"causal": True}, {"causal": True}),
                           ({"custom_mask": mask}, {"causal": False, "mask": mask})):
        out = flashinfer.single_prefill_with_kv_cache(q, kin, vin, kv_layout=layout,
                                                      sm_scale=0.05, **kwargs)
        want, _ = reference(qval, kval, vval, sm_scale=0.05, **ref_kw)
        assert_close(out, want, dtype, f"single prefill {list(kwargs)}")


def test_merge_state_and_states(rng):
    n, h, d, s_count = 37, 4, 64, 5
    v = rng.standard_normal((n, s_count, h, d)).astype(np.float32)
    s = (rng.standard_normal((n, s_count, h)) * 4).astype(np.float32)
    s[0, :, 0] = -np.inf          # a row no state saw
    s[1, 2, 1] = -np.inf          # one empty state
    w = np.exp2(s.astype(np.float64) - np.where(np.isfinite(s.max(1)), s.max(1), 0)[:, None])
    tot = w.sum(1)
    want_v = np.einsum("nsh,nshd->nhd", w, v) / np.where(tot > 0, tot, 1)[..., None]
    with np.errstate(divide="ignore"):
        want_s = np.log2(np.exp2(s.astype(np.float64)).sum(1))
    got_v, got_s = flashinfer.merge_states(v, s)
    assert np.allclose(got_v, want_v, atol=1e-5)
    assert np.allclose(got_s, want_s, atol=1e-5, equal_nan=False) or \
        np.array_equal(np.isneginf(got_s), np.isneginf(want_s))
    assert_lse_close(got_s, want_s, "merge_states")
    a_v, a_s = flashinfer.merge_state(v[:, 0], s[:, 0], v[:, 1], s[:, 1])
    w2 = w[:, :2] / np.where(w[:, :2].sum(1) > 0, w[:, :2].sum(1), 1)[:, None]
    assert np.allclose(a_v, np.einsum("nsh,nshd->nhd", w2, v[:, :2]), atol=1e-5)
    with np.errstate(divide="ignore"):
        assert_lse_close(a_s, np.log2(np.exp2(s[:, :2].astype(np.float64)).sum(1)), "merge_state")
    v0, s0 = v[:, 0].copy(), s[:, 0].copy()
    flashinfer.merge_state_in_place(v0, s0, v[:, 1], s[:, 1])
    assert np.allclose(v0, a_v) and np.array_equal(s0, a_s)


def test_merge_splits_equal_full_attention(rng):
    """Attention over [A; B] equals merge_state of attention over A and over B (LSE base 2)."""
    hq, hkv, d = 4, 2, 64
    k = rng.standard_normal((90, hkv, d)).astype(np.float32)
    v = rng.standard_normal((90, hkv, d)).astype(np.float32)
    q = rng.standard_normal((3, hq, d)).astype(np.float32)
    oa, sa = flashinfer.single_prefill_with_kv_cache(q, k[:50], v[:50], return_lse=True)
    ob, sb = flashinfer.single_prefill_with_kv_cache(q, k[50:], v[50:], return_lse=True)
    o, s = flashinfer.merge_state(oa, sa, ob, sb)
    want, want_lse = reference(q.astype(np.float64), k.astype(np.float64),
                               v.astype(np.float64), causal=False, sm_scale=1 / math.sqrt(d))
    assert_close(o, want, "float32", "merged")
    assert_lse_close(s, want_lse, "merged")


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_append_paged_kv_cache_then_decode(rng, layout, page_size):
    hkv, d = 2, 32
    old = [int(x) for x in rng.integers(0, 40, size=4)]
    new = [int(x) for x in rng.integers(1, 25, size=4)]
    total = [o + n for o, n in zip(old, new)]
    cache = PagedCache(rng, total, page_size, hkv, d, d, "float32", layout)
    append_indptr = np.concatenate([[0], np.cumsum(new)]).astype(np.int32)
    seq_lens = np.array(total, np.int32)
    batch, pos = flashinfer.get_batch_indices_positions(append_indptr, seq_lens,
                                                        int(append_indptr[-1]))
    want_b = np.concatenate([[b] * n for b, n in enumerate(new)])
    want_p = np.concatenate([np.arange(o, o + n) for o, n in zip(old, new)])
    assert np.array_equal(batch, want_b) and np.array_equal(pos, want_p)
    keys = rng.standard_normal((int(append_indptr[-1]), hkv, d)).astype(np.float32)
    vals = rng.standard_normal((int(append_indptr[-1]), hkv, d)).astype(np.float32)
    k_before, v_before = cache.k.copy(), cache.v.copy()
    flashinfer.append_paged_kv_cache(keys, vals, batch, pos, (cache.k, cache.v), cache.indices,
                                     cache.indptr, cache.last_page_len, kv_layout=layout)
    changed = np.zeros(cache.k.shape, bool)
    for i in range(len(keys)):
        b, p = want_b[i], want_p[i]
        page = cache.indices[cache.indptr[b] + p // page_size]
        idx = (page, p % page_size) if layout == "NHD" else (page, slice(None), p % page_size)
        assert np.array_equal(cache.k[idx], keys[i]) and np.array_equal(cache.v[idx], vals[i])
        changed[idx] = True
    same = ~changed
    assert np.array_equal(cache.k[same], k_before[same], equal_nan=True)
    assert np.array_equal(cache.v[same], v_before[same], equal_nan=True)


def test_packbits_matches_numpy(rng):
    x = rng.random(101) < 0.5
    for order in ("big", "little"):
        assert np.array_equal(flashinfer.packbits(x, order), np.packbits(x, bitorder=order))
    indptr = np.array([0, 4, 7, 11, 11, 101])
    y, new_indptr = flashinfer.segment_packbits(x, indptr, bitorder="big")
    assert np.array_equal(new_indptr, [0, 1, 2, 3, 3, 15])
    for i in range(5):
        seg = np.packbits(x[indptr[i]:indptr[i + 1]])
        assert np.array_equal(y[new_indptr[i]:new_indptr[i + 1]], seg)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("joined", [True, False])
def test_mla_paged(rng, dtype, page_size, joined):
    heads, ckv, kpe = 16, 128, 32
    qo_kv = [(int(q), int(q + rng.integers(0, 90))) for q in rng.integers(1, 6, size=4)]
    qo_lens, kv_lens, qo_indptr = _prefill_case(rng, page_size, qo_kv)
    cache = PagedCache(rng, kv_lens, page_size, 1, ckv + kpe, ckv + kpe, dtype, "NHD")
    latent = cache.k[:, :, 0]  # [pages, P, ckv + kpe]; V is its first ckv elements
    refs = [(k, k[..., :ckv]) for k in cache.k_ref]
    if joined:
        ckv_cache, kpe_cache = latent[..., :ckv], latent[..., ckv:]
    else:
        ckv_cache = np.ascontiguousarray(latent[..., :ckv])
        kpe_cache = np.ascontiguousarray(latent[..., ckv:])
    sm_scale = 1 / math.sqrt(ckv + kpe)
    w = flashinfer.BatchMLAPagedAttentionWrapper(WORKSPACE)
    w.plan(qo_indptr, cache.indptr, cache.indices, np.array(kv_lens, np.int32), heads, ckv, kpe,
           page_size, True, sm_scale, dtype, dtype)
    q, qval = _random_q(rng, int(qo_indptr[-1]), heads, ckv + kpe, dtype)
    out, lse = w.run(q[..., :ckv], q[..., ckv:], ckv_cache, kpe_cache, return_lse=True,
                     return_lse_base_on_e=True)
    assert out.shape == (int(qo_indptr[-1]), heads, ckv)
    for b in range(len(qo_kv)):
        s, e = qo_indptr[b], qo_indptr[b + 1]
        want, want_lse = reference(qval[s:e], *refs[b], causal=True, sm_scale=sm_scale)
        assert_close(out[s:e], want, dtype, f"request {b}")
        assert_lse_close(lse[s:e], want_lse * math.log(2.0), f"request {b}")


def test_mla_latent_view_is_zero_copy(rng):
    from pagoda import _arrays
    buf = rng.standard_normal((5, 16, 160)).astype(np.float32)
    joined = _arrays.joined_last(buf[..., :128], buf[..., 128:])
    assert np.shares_memory(joined, buf) and np.array_equal(joined, buf)
    apart = _arrays.joined_last(buf[..., :128].copy(), buf[..., 128:].copy())
    assert not np.shares_memory(apart, buf) and np.array_equal(apart, buf)
