"""pagoda.flashinfer's sampling functions: empirical frequencies of many draws against the
distribution computed here from the definitions (top-k, then top-p over the renormalised top-k
mass, then min-p relative to the largest kept probability), with 5-sigma bounds; tokens outside
the kept set must never appear."""
import numpy as np
import pytest

import pagoda.flashinfer as flashinfer


def expected(p, top_k=0, top_p=1.0, min_p=0.0):
    order = np.argsort(-p, kind="stable")
    q = p[order].astype(np.float64)
    keep = len(q) if top_k <= 0 else min(top_k, len(q))
    q = q[:keep] / q[:keep].sum()
    n = int(np.argmax(np.cumsum(q) >= top_p - 1e-9)) + 1
    q = q[:n]
    q = np.where(q >= min_p * q.max(), q, 0.0)
    out = np.zeros(len(p))
    out[order[: len(q)]] = q / q.sum()
    return out


CASES = [
    ("sampling_from_probs", {}, {}),
    ("top_p_sampling_from_probs", {"top_p": 0.6}, {"top_p": 0.6}),
    ("top_k_sampling_from_probs", {"top_k": 3}, {"top_k": 3}),
    ("min_p_sampling_from_probs", {"min_p": 0.3}, {"min_p": 0.3}),
    ("top_k_top_p_sampling_from_probs", {"top_k": 5, "top_p": 0.8}, {"top_k": 5, "top_p": 0.8}),
    ("top_k_top_p_sampling_from_logits", {"top_k": 4, "top_p": 0.9}, {"top_k": 4, "top_p": 0.9}),
    ("sampling_from_logits", {}, {}),
]


@pytest.mark.parametrize("name,kwargs,filters", CASES, ids=[c[0] for c in CASES])
def test_sampling_distribution(rng, name, kwargs, filters):
    vocab, draws = 12, 40000
    p = rng.dirichlet(np.ones(vocab) * 0.7)
    rows = np.stack([p, rng.dirichlet(np.ones(vocab))]).astype(np.float32)
    x = np.log(rows) if name.endswith("logits") else rows
    indices = np.zeros(draws, np.int32)  # every draw from row 0
    samples = getattr(flashinfer, name)(x, indices=indices, generator=rng, **kwargs)
    assert samples.dtype == np.int32 and samples.shape == (draws,)
    want = expected(rows[0].astype(np.float64), **filters)
    freq = np.bincount(samples, minlength=vocab) / draws
    assert (freq[want == 0] == 0).all(), f"tokens outside the kept set: {freq[want == 0]}"
    sigma = np.sqrt(want * (1 - want) / draws)
    assert (np.abs(freq - want) <= 5 * sigma + 1e-3).all(), (freq, want)


def test_per_row_parameters_and_reproducibility(rng):
    probs = rng.dirichlet(np.ones(50), size=6).astype(np.float32)
    top_k = np.array([1, 2, 3, 50, 0, 1], np.int32)
    a = flashinfer.top_k_sampling_from_probs(probs, top_k, generator=np.random.default_rng(3))
    b = flashinfer.top_k_sampling_from_probs(probs, top_k, generator=np.random.default_rng(3))
    assert np.array_equal(a, b)
    for i, k in enumerate(top_k):
        allowed = np.argsort(-probs[i], kind="stable")[: k if k > 0 else 50]
        assert a[i] in allowed
    assert a[0] == np.argmax(probs[0]) and a[5] == np.argmax(probs[5])


def test_sampling_errors():
    probs = np.full((2, 4), 0.25, np.float32)
    with pytest.raises(ValueError, match="top_p"):
        flashinfer.top_p_sampling_from_probs(probs, 0.0)
    with pytest.raises(ValueError, match="shape"):
        flashinfer.top_k_sampling_from_probs(probs, np.array([1, 2, 3]))
    with pytest.raises(NotImplementedError, match="joint"):
        flashinfer.top_k_top_p_sampling_from_probs(probs, 2, 0.5, filter_apply_order="joint")
    bad = probs.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        flashinfer.sampling_from_probs(bad, check_nan=True)
