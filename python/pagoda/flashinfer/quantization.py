"""FlashInfer's packbits / segment_packbits (the custom-mask packing), NumPy semantics.

Results come back in the input's framework and on its device; the packing itself runs on the
host (numpy.packbits)."""
import numpy as np

from pagoda import _arrays as A


def _check_bitorder(bitorder):
    if bitorder not in ("big", "little"):
        raise ValueError(f"bitorder must be 'big' or 'little', got {bitorder!r}")


def packbits(x, bitorder="big"):
    """x: 1-D binary-valued array. Returns uint8 [(len(x) + 7) // 8]."""
    _check_bitorder(bitorder)
    a = A.host_numpy(x)
    if a.ndim != 1:
        raise ValueError(f"packbits takes a 1-D array, got shape {tuple(a.shape)}")
    return A.like(np.packbits(a.astype(bool), bitorder=bitorder), x)


def segment_packbits(x, indptr, bitorder="big"):
    """x: 1-D binary-valued [indptr[-1]]; indptr [batch_size + 1]. Returns (y, new_indptr): y
    uint8 [new_indptr[-1]] with segment i's bits packed in y[new_indptr[i]:new_indptr[i+1]],
    new_indptr[i+1] - new_indptr[i] == (indptr[i+1] - indptr[i] + 7) // 8 (indptr's dtype)."""
    _check_bitorder(bitorder)
    a = A.host_numpy(x).astype(bool)
    ind = A.host_numpy(indptr)
    if a.ndim != 1 or ind.ndim != 1 or len(ind) == 0:
        raise ValueError("segment_packbits takes a 1-D x and a non-empty 1-D indptr")
    seg = np.diff(ind)
    if np.any(seg < 0) or ind[-1] > len(a):
        raise ValueError(f"indptr must be non-decreasing and end within x ({len(a)} entries)")
    new_indptr = np.zeros(len(ind), dtype=ind.dtype)
    new_indptr[1:] = np.cumsum((seg + 7) // 8)
    parts = [np.packbits(a[ind[i]:ind[i + 1]], bitorder=bitorder) for i in range(len(seg))]
    y = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    return A.like(y.astype(np.uint8), x), A.like(new_indptr, indptr)
