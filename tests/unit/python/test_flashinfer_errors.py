"""Bad arguments to pagoda.flashinfer raise what FlashInfer raises (ValueError / KeyError /
RuntimeError), with a message naming the problem; what pagoda lacks raises NotImplementedError
naming it; nothing is written on failure."""
import numpy as np
import pytest

import pagoda.flashinfer as flashinfer

WS = np.zeros(1 << 20, np.uint8)


def _decode_setup(rng, dtype=np.float16):
    k = rng.standard_normal((6, 16, 2, 64)).astype(dtype)
    v = rng.standard_normal((6, 16, 2, 64)).astype(dtype)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(WS)
    indptr, indices, last = np.array([0, 2, 3], np.int32), np.array([4, 1, 0], np.int32), \
        np.array([5, 16], np.int32)
    w.plan(indptr, indices, last, 8, 2, 64, 16)
    return w, k, v


def test_run_before_plan():
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(WS)
    with pytest.raises(RuntimeError, match="before plan"):
        w.run(np.zeros((1, 8, 64), np.float16), (np.zeros((1, 16, 2, 64), np.float16),) * 2)
    p = flashinfer.BatchPrefillWithPagedKVCacheWrapper(WS)
    with pytest.raises(RuntimeError, match="before plan"):
        p.run(np.zeros((1, 8, 64), np.float16), (np.zeros((1, 16, 2, 64), np.float16),) * 2)


def test_bad_layout_and_backend():
    with pytest.raises(KeyError, match="Invalid kv_layout"):
        flashinfer.BatchDecodeWithPagedKVCacheWrapper(WS, "NDH")
    with pytest.raises(NotImplementedError, match="trtllm-gen"):
        flashinfer.BatchPrefillWithPagedKVCacheWrapper(WS, backend="trtllm-gen")
    with pytest.raises(NotImplementedError, match="use_cuda_graph"):
        flashinfer.BatchDecodeWithPagedKVCacheWrapper(WS, use_cuda_graph=True)


def test_unsupported_features_are_named(rng):
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(WS)
    args = (np.array([0, 1], np.int32), np.array([0], np.int32), np.array([3], np.int32), 8, 2,
            64, 16)
    with pytest.raises(NotImplementedError, match="ROPE_LLAMA"):
        w.plan(*args, pos_encoding_mode="ROPE_LLAMA")
    with pytest.raises(NotImplementedError, match="fixed_split_size"):
        w.plan(*args, fixed_split_size=64)
    p = flashinfer.BatchPrefillWithPagedKVCacheWrapper(WS)
    with pytest.raises(NotImplementedError, match="use_fp16_qk_reduction"):
        p.plan(np.array([0, 1], np.int32), *args, use_fp16_qk_reduction=True)


def test_dtype_shape_mismatch_and_nothing_written(rng):
    w, k, v = _decode_setup(rng)
    out = np.full((2, 8, 64), 7, np.float16)
    with pytest.raises(ValueError, match="dtype of q"):
        w.run(np.zeros((2, 8, 64), np.float32), (k, v), out=out)
    with pytest.raises(ValueError, match="shape of q"):
        w.run(np.zeros((3, 8, 64), np.float16), (k, v), out=out)
    with pytest.raises(ValueError, match="dtype of k"):
        w.run(np.zeros((2, 8, 64), np.float16), (k.astype(np.float32), v.astype(np.float32)),
              out=out)
    with pytest.raises(ValueError, match="k_cache"):
        w.run(np.zeros((2, 8, 64), np.float16), (k[:, :8], v[:, :8]), out=out)
    with pytest.raises(ValueError, match="shape of out"):
        w.run(np.zeros((2, 8, 64), np.float16), (k, v), out=np.zeros((2, 8, 32), np.float16))
    with pytest.raises(ValueError, match="dtype of lse"):
        w.run(np.zeros((2, 8, 64), np.float16), (k, v), lse=np.zeros((2, 8), np.float16),
              return_lse=True)
    assert (out == 7).all()


def test_bad_page_table():
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(WS)
    with pytest.raises(ValueError):  # last_page_len beyond page_size
        w.plan(np.array([0, 1], np.int32), np.array([0], np.int32), np.array([17], np.int32), 8,
               2, 64, 16)
    with pytest.raises(ValueError):  # indptr decreasing
        w.plan(np.array([0, 2, 1], np.int32), np.array([0, 1], np.int32),
               np.array([1, 1], np.int32), 8, 2, 64, 16)
    with pytest.raises(ValueError, match="multiple"):
        w.plan(np.array([0, 1], np.int32), np.array([0], np.int32), np.array([1], np.int32), 6,
               4, 64, 16)


def test_page_id_outside_cache_raises(rng):
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(WS)
    w.plan(np.array([0, 1], np.int32), np.array([9], np.int32), np.array([3], np.int32), 8, 2,
           64, 16)
    k = np.zeros((4, 16, 2, 64), np.float16)
    with pytest.raises(ValueError):
        w.run(np.zeros((1, 8, 64), np.float16), (k, k))


def test_workspace_too_small():
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(np.zeros(16, np.uint8))
    with pytest.raises(RuntimeError, match="workspace"):
        w.plan(np.array([0, 1], np.int32), np.array([0], np.int32), np.array([3], np.int32), 8,
               2, 64, 16)


def test_mask_size_mismatch():
    p = flashinfer.BatchPrefillWithPagedKVCacheWrapper(WS)
    with pytest.raises(ValueError, match="custom_mask"):
        p.plan(np.array([0, 2], np.int32), np.array([0, 1], np.int32), np.array([0], np.int32),
               np.array([3], np.int32), 8, 2, 64, 16, custom_mask=np.ones(5, bool))


def test_helpers_reject_bad_input():
    with pytest.raises(ValueError, match="bitorder"):
        flashinfer.packbits(np.ones(3, bool), "middle")
    with pytest.raises(ValueError):
        flashinfer.merge_state(np.zeros((2, 4, 8), np.float32), np.zeros((2, 4), np.float16),
                               np.zeros((2, 4, 8), np.float32), np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="positions"):
        k = np.zeros((2, 4, 1, 8), np.float32)
        flashinfer.append_paged_kv_cache(np.zeros((1, 1, 8), np.float32),
                                         np.zeros((1, 1, 8), np.float32), np.array([0]),
                                         np.array([5]), (k, k), np.array([0]), np.array([0, 1]),
                                         np.array([3]))


def test_names_pagoda_does_not_provide():
    with pytest.raises(NotImplementedError, match="CUDAGraphBatchDecodeWithPagedKVCacheWrapper"):
        flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper
    assert not hasattr(flashinfer, "top_k_renorm_probs")
    assert not hasattr(flashinfer, "no_such_name")
