"""FlashInfer 0.5's sampling functions on pagoda's host sampler (model/host_sampling.h), for
host arrays (NumPy, torch CPU).

Semantics: candidates in descending probability order; top-k keeps k (<= 0 or >= vocab: all);
top-p keeps the smallest prefix whose renormalised mass reaches p; min-p drops tokens with
p < min_p * p_max; the token is drawn by inverse CDF from a counter-based uniform. Returns int32
[batch_size] in the input's framework. Draws are not FlashInfer's (a different generator) but
follow the same distributions; `generator` (a torch.Generator or numpy Generator) seeds them, so
equal generator states give equal samples. filter_apply_order="top_k_first" only. CUDA tensors
raise NotImplementedError (pagoda's device sampler is not bound yet).
"""
import numpy as np

from pagoda import _arrays as A
from pagoda import _pagoda
from pagoda.flashinfer import _paged as P


def _per_row(value, n, dtype, name):
    if A.is_torch(value) or isinstance(value, np.ndarray):
        a = A.host_numpy(value).astype(dtype)
        if a.shape != (n,):
            raise ValueError(f"{name} must be a scalar or have shape ({n},), got {a.shape}")
        return np.ascontiguousarray(a)
    return np.full(n, value, dtype)


def _seeds(n, generator, x):
    if generator is not None and hasattr(generator, "integers"):
        return generator.integers(0, 2**63, size=n, dtype=np.uint64)
    if A.is_torch(x):
        import torch
        s = torch.randint(0, 2**62, (n,), generator=generator, dtype=torch.int64)
        return s.numpy().astype(np.uint64)
    return np.random.default_rng().integers(0, 2**63, size=n, dtype=np.uint64)


def _sample(x, *, from_probs, indices, generator, check_nan, top_k=0, top_p=1.0, min_p=0.0,
            filter_apply_order="top_k_first", who):
    if filter_apply_order != "top_k_first":
        P.unsupported(f"{who}(filter_apply_order={filter_apply_order!r})")
    if A.device_of(x) != "cpu":
        P.unsupported(f"{who} on {A.device_of(x)} tensors", "pagoda's device sampler is not "
                      "bound yet; host arrays only")
    rows = A.host_numpy(x).astype(np.float32, copy=False)
    if rows.ndim != 2:
        raise ValueError(f"{who}: expected [batch_size, vocab], got shape {rows.shape}")
    if check_nan and np.isnan(rows).any():
        raise ValueError(f"{who}: input contains NaN")
    if from_probs:
        with np.errstate(divide="ignore"):
            rows = np.log(rows)
    idx = np.arange(rows.shape[0], dtype=np.int32) if indices is None else \
        A.host_numpy(indices).astype(np.int32)
    n = len(idx)
    out = np.empty(n, np.int32)
    _pagoda.sample_rows(np.ascontiguousarray(rows, np.float32), np.ascontiguousarray(idx),
                        np.ones(n, np.float32), _per_row(top_k, n, np.int32, "top_k"),
                        _per_row(top_p, n, np.float32, "top_p"),
                        _per_row(min_p, n, np.float32, "min_p"), _seeds(n, generator, x), 0,
                        out)
    return A.like(out, x)


def sampling_from_logits(logits, indices=None, deterministic=True, generator=None,
                         check_nan=False):
    return _sample(logits, from_probs=False, indices=indices, generator=generator,
                   check_nan=check_nan, who="sampling_from_logits")


def sampling_from_probs(probs, indices=None, deterministic=True, generator=None,
                        check_nan=False):
    return _sample(probs, from_probs=True, indices=indices, generator=generator,
                   check_nan=check_nan, who="sampling_from_probs")


def top_p_sampling_from_probs(probs, top_p, indices=None, deterministic=True, generator=None,
                              check_nan=False):
    return _sample(probs, from_probs=True, indices=indices, generator=generator,
                   check_nan=check_nan, top_p=top_p, who="top_p_sampling_from_probs")


def top_k_sampling_from_probs(probs, top_k, indices=None, deterministic=True, generator=None,
                              check_nan=False):
    return _sample(probs, from_probs=True, indices=indices, generator=generator,
                   check_nan=check_nan, top_k=top_k, who="top_k_sampling_from_probs")


def min_p_sampling_from_probs(probs, min_p, indices=None, deterministic=True, generator=None,
                              check_nan=False):
    return _sample(probs, from_probs=True, indices=indices, generator=generator,
                   check_nan=check_nan, min_p=min_p, who="min_p_sampling_from_probs")


def top_k_top_p_sampling_from_logits(logits, top_k, top_p, indices=None,
                                     filter_apply_order="top_k_first", deterministic=True,
                                     generator=None, check_nan=False):
    return _sample(logits, from_probs=False, indices=indices, generator=generator,
                   check_nan=check_nan, top_k=top_k, top_p=top_p,
                   filter_apply_order=filter_apply_order, who="top_k_top_p_sampling_from_logits")


def top_k_top_p_sampling_from_probs(probs, top_k, top_p, indices=None,
                                    filter_apply_order="top_k_first", deterministic=True,
                                    generator=None, check_nan=False):
    return _sample(probs, from_probs=True, indices=indices, generator=generator,
                   check_nan=check_nan, top_k=top_k, top_p=top_p,
                   filter_apply_order=filter_apply_order, who="top_k_top_p_sampling_from_probs")
