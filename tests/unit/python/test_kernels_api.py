"""pagoda's own API from Python: BatchAttention plan/run over a KvPool's NumPy views (checked
against conftest.reference), and PageAllocator + RadixCache against a small obviously-correct
model of page-aligned prefix matching."""
import math

import numpy as np
import pytest

import pagoda
from pagoda import _pagoda
from conftest import assert_close, assert_lse_close, bf16_bits, bf16_value, reference


@pytest.mark.parametrize("backend,kernel_options",
                         [("cpu", {}), ("reference", {}),
                          ("cpu", {"cpu_bf16": False, "cpu_bf16_decode": True})])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_batch_attention_over_kv_pool(rng, backend, kernel_options, dtype):
    hq, hkv, d, page_size, layers = 8, 2, 64, 16, 2
    alloc = _pagoda.PageAllocator(64, page_size)
    pool = _pagoda.KvPool(layers, 64, page_size, hkv, d, dtype)
    for layer in range(layers):  # poison every slot; requests overwrite theirs
        pool.k_cache(layer)[...] = bf16_bits(np.nan) if dtype == "bf16" else np.nan
        pool.v_cache(layer)[...] = bf16_bits(np.nan) if dtype == "bf16" else np.nan
    kv_lens = [int(x) for x in rng.integers(1, 200, size=4)]
    qo_lens = [int(rng.integers(1, n + 1)) for n in kv_lens]
    kv_indptr, kv_indices, last, refs = [0], [], [], []
    for n in kv_lens:
        pages = (n + page_size - 1) // page_size
        slots = alloc.alloc(pages * page_size)[:n]
        k = rng.standard_normal((n, hkv, d)).astype(np.float32)
        v = rng.standard_normal((n, hkv, d)).astype(np.float32)
        if dtype == "bf16":
            k, v = bf16_bits(k), bf16_bits(v)
            refs.append((bf16_value(k).astype(np.float64), bf16_value(v).astype(np.float64)))
        else:
            refs.append((k.astype(np.float64), v.astype(np.float64)))
        pool.set_kv(1, slots, k, v, dtype=dtype)
        kv_indices += list(slots[::page_size] // page_size)
        kv_indptr.append(len(kv_indices))
        last.append(n - (pages - 1) * page_size)
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    nnz = int(qo_indptr[-1])
    attn = pagoda.BatchAttention(backend, kernel_options=kernel_options)
    assert attn.name == backend
    attn.plan(qo_indptr, np.array(kv_indptr, np.int32), np.array(kv_indices, np.int32),
              np.array(last, np.int32), page_size, hq, hkv, d, d, dtype, dtype, "f32")
    q = rng.standard_normal((nnz, hq, d)).astype(np.float32)
    qin = bf16_bits(q) if dtype == "bf16" else q
    qval = bf16_value(qin).astype(np.float64) if dtype == "bf16" else q.astype(np.float64)
    out = np.full((nnz, hq, d), np.nan, np.float32)
    lse = np.full((nnz, hq), np.nan, np.float32)
    attn.run(qin, pool.k_cache(1), pool.v_cache(1), out, lse, sm_scale=1 / math.sqrt(d),
             causal=True, q_dtype=dtype, kv_dtype=dtype)
    for b in range(len(kv_lens)):
        s, e = qo_indptr[b], qo_indptr[b + 1]
        want, want_lse = reference(qval[s:e], *refs[b], causal=True, sm_scale=1 / math.sqrt(d))
        assert_close(out[s:e], want, "float32", f"{backend} request {b}")
        assert_lse_close(lse[s:e], want_lse, f"{backend} request {b}")


def test_batch_attention_errors():
    attn = pagoda.BatchAttention("cpu")
    with pytest.raises(RuntimeError, match="before plan"):
        z = np.zeros((1, 1, 1, 8), np.float32)
        attn.run(np.zeros((1, 1, 8), np.float32), z, z, np.zeros((1, 1, 8), np.float32))
    with pytest.raises(ValueError, match="unknown backend"):
        pagoda.BatchAttention("tpu")
    # Kernel options as `--kernel-option`: an unknown name or a bad value is named.
    with pytest.raises(ValueError, match="unknown kernel option 'sm90_tmaa'"):
        pagoda.BatchAttention("cpu", kernel_options={"sm90_tmaa": 0})
    with pytest.raises(ValueError, match="merge_threads must be"):
        pagoda.BatchAttention("cpu", kernel_options={"merge_threads": 48})
    with pytest.raises(ValueError, match="cpu_bf16"):
        pagoda.BatchAttention("cpu", kernel_options={"cpu_bf16": "maybe"})
    if "cuda" not in pagoda.available_backends():
        with pytest.raises(NotImplementedError, match="cuda"):
            pagoda.BatchAttention("cuda")
    with pytest.raises(ValueError, match="num_pages|page|last"):
        attn.plan(np.array([0, 1], np.int32), np.array([0, 1], np.int32),
                  np.array([1], np.int32), np.array([9], np.int32), 4, 2, 2, 8, 8, "f32", "f32",
                  "f32")


def test_radix_cache_matches_a_model(rng):
    page_size = 4
    alloc = _pagoda.PageAllocator(400, page_size)
    tree = _pagoda.RadixCache(alloc)
    stored = []  # (tokens, slots) in insertion order
    vocab = 3  # a small alphabet makes shared prefixes common

    def model_match(tokens):
        best = np.zeros(0, np.int32)
        length = 0
        for toks, _ in stored:
            n = 0
            while n < min(len(toks), len(tokens)) and toks[n] == tokens[n]:
                n += 1
            length = max(length, n // page_size * page_size)
        slots = np.zeros(length, np.int32)
        for i in range(length):  # the first insert that reached position i owns it
            for toks, sl in stored:
                n = 0
                while n < min(len(toks), len(tokens)) and toks[n] == tokens[n]:
                    n += 1
                if n // page_size * page_size > i:
                    slots[i] = sl[i]
                    break
        return slots if length else best

    for step in range(60):
        tokens = [int(x) for x in rng.integers(0, vocab, size=int(rng.integers(1, 24)))]
        if rng.random() < 0.5:
            got, node = tree.match_prefix(tokens)
            assert np.array_equal(got, model_match(tokens)), f"step {step}: match {tokens}"
        else:
            aligned = len(tokens) // page_size * page_size
            if aligned == 0:
                continue
            tokens = tokens[:aligned]
            slots = alloc.alloc(aligned)
            before = model_match(tokens)
            assert tree.insert(tokens, slots) == len(before), f"step {step}: insert"
            stored.append((tokens, slots))
            alloc.free(slots)  # the tree holds its own references
        tree.check_integrity()
        alloc.check_integrity()
    cached = tree.evictable_size()
    pages = {tuple(t[:end]) for t, _ in stored for end in range(page_size, len(t) + 1, page_size)}
    assert cached == len(pages) * page_size  # every distinct page-aligned prefix, once
    assert tree.evict(10**6) == cached and tree.evictable_size() == 0
    assert alloc.available_size() == 400 * page_size
