"""FlashInfer's paged-KV helpers: get_batch_indices_positions and append_paged_kv_cache.

The index math runs on the host; the scatter into the cache runs in the cache's framework and on
its device (fancy-index assignment, no copy of the cache)."""
import numpy as np

from pagoda import _arrays as A
from pagoda.flashinfer import _paged as P


def get_batch_indices_positions(append_indptr, seq_lens, nnz):
    """append_indptr [batch_size + 1], seq_lens [batch_size] (KV length after the append), nnz.
    Returns (batch_indices [nnz], positions [nnz]) int32: entry i of request b sits at position
    seq_lens[b] - append_len[b] + (i - append_indptr[b])."""
    indptr = A.host_numpy(append_indptr).astype(np.int64)
    lens = A.host_numpy(seq_lens).astype(np.int64)
    if indptr.ndim != 1 or lens.shape != (len(indptr) - 1,):
        raise ValueError(f"append_indptr {tuple(indptr.shape)} must be [batch_size + 1] and "
                         f"seq_lens {tuple(lens.shape)} [batch_size]")
    append = np.diff(indptr)
    if np.any(append < 0) or np.any(append > lens):
        raise ValueError("append_indptr must be non-decreasing with append lengths <= seq_lens")
    if int(indptr[-1]) > nnz:
        raise ValueError(f"nnz ({nnz}) is smaller than append_indptr[-1] ({indptr[-1]})")
    batch = np.full(nnz, -1, np.int32)
    pos = np.full(nnz, -1, np.int32)
    for b in range(len(append)):
        s, e = indptr[b], indptr[b + 1]
        batch[s:e] = b
        pos[s:e] = np.arange(lens[b] - append[b], lens[b], dtype=np.int32)
    return A.like(batch, append_indptr), A.like(pos, append_indptr)


def append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache,
                          kv_indices, kv_indptr, kv_last_page_len, kv_layout="NHD"):
    """append_key / append_value [nnz, num_kv_heads, head_dim]; batch_indices, positions [nnz]
    int32; the page table (kv_indices, kv_indptr, kv_last_page_len) already covers the appended
    tokens. Writes entry i at page kv_indices[kv_indptr[b] + positions[i] // page_size], slot
    positions[i] % page_size, in place."""
    P.check_kv_layout(kv_layout)
    k, v = P.unpack_paged_kv_cache(paged_kv_cache, kv_layout)  # NHD views of the caller's cache
    page_size = k.shape[1]
    b = A.host_numpy(batch_indices).astype(np.int64)
    p = A.host_numpy(positions).astype(np.int64)
    indices = A.host_numpy(kv_indices).astype(np.int64)
    indptr = A.host_numpy(kv_indptr).astype(np.int64)
    last = A.host_numpy(kv_last_page_len).astype(np.int64)
    nnz = append_key.shape[0]
    if tuple(append_key.shape) != (nnz,) + tuple(k.shape[2:]) or \
            tuple(append_value.shape) != (nnz,) + tuple(v.shape[2:]):
        raise ValueError(f"append_key {tuple(append_key.shape)} / append_value "
                         f"{tuple(append_value.shape)} must be [nnz, num_kv_heads, head_dim] "
                         f"matching the cache {tuple(k.shape)}")
    if b.shape != (nnz,) or p.shape != (nnz,):
        raise ValueError(f"batch_indices and positions must have {nnz} entries")
    if A.dtype_name(append_key) != A.dtype_name(k) or A.dtype_name(append_value) != A.dtype_name(v):
        raise ValueError(f"append_key dtype {A.dtype_name(append_key)} differs from the cache's "
                         f"{A.dtype_name(k)}")
    bs = len(indptr) - 1
    if nnz and (b.min() < 0 or b.max() >= bs):
        raise ValueError(f"batch_indices must be in [0, {bs})")
    kv_len = (indptr[1:] - indptr[:-1] - 1) * page_size + last
    if nnz and (p.min() < 0 or np.any(p >= kv_len[b])):
        raise ValueError("positions must be in [0, kv_len) of their request")
    page = indices[indptr[b] + p // page_size]
    if nnz and (page.min() < 0 or page.max() >= k.shape[0]):
        raise ValueError(f"a page id is outside the cache's {k.shape[0]} pages")
    page, slot = A.like(page, k), A.like(p % page_size, k)
    k[page, slot] = append_key
    v[page, slot] = append_value
