"""pagoda.flashinfer on torch tensors: CPU always, CUDA where torch sees a GPU (the CUDA kernels,
on the caller's current stream). Outputs must come back as torch tensors on the inputs' device.
Same independent reference as the NumPy suite (conftest.reference, float64)."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import pagoda.flashinfer as flashinfer  # noqa: E402
from conftest import reference  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))]
DTYPES = {"float16": (torch.float16, 2e-2), "bfloat16": (torch.bfloat16, 6e-2),
          "float32": (torch.float32, 2e-4)}


def _f64(t):
    return t.detach().float().cpu().numpy().astype(np.float64)


def _gen(rng):
    return torch.Generator().manual_seed(int(rng.integers(1 << 30)))


def _paged(rng, kv_lens, page_size, hkv, d, dtype, device, layout, spare=3):
    pages = [(n + page_size - 1) // page_size for n in kv_lens]
    total = sum(pages) + spare
    order = torch.from_numpy(rng.permutation(total).astype(np.int32))
    indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32)
    indices = order[: int(indptr[-1])]
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(kv_lens, pages)],
                        dtype=torch.int32)
    k = torch.full((total, page_size, hkv, d), float("nan"))
    v = torch.full((total, page_size, hkv, d), float("nan"))
    g = _gen(rng)
    refs = []
    for b, n in enumerate(kv_lens):
        kb = torch.randn(n, hkv, d, generator=g).to(dtype)
        vb = torch.randn(n, hkv, d, generator=g).to(dtype)
        refs.append((_f64(kb), _f64(vb)))
        for t in range(n):
            page = int(indices[int(indptr[b]) + t // page_size])
            k[page, t % page_size] = kb[t].float()
            v[page, t % page_size] = vb[t].float()
    k, v = k.to(dtype), v.to(dtype)
    if layout == "HND":
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    return k.to(device), v.to(device), indptr.to(device), indices.to(device), last.to(device), refs


def _check(got, want, tol, what):
    g = _f64(got)
    assert np.isfinite(g).all(), what
    assert np.abs(g - want).max() <= tol * max(1.0, np.abs(want).max()), what


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_decode_and_prefill(rng, device, dtype, layout, page_size):
    tdt, tol = DTYPES[dtype]
    hq, hkv, d = 8, 2, 128
    kv_lens = [int(x) for x in rng.integers(1, 300, size=5)]
    k, v, indptr, indices, last, refs = _paged(rng, kv_lens, page_size, hkv, d, tdt, device,
                                               layout)
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=device)
    g = _gen(rng)
    dec = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, layout, use_tensor_cores=True)
    dec.plan(indptr, indices, last, hq, hkv, d, page_size, q_data_type=tdt, logits_soft_cap=30.0)
    q = torch.randn(len(kv_lens), hq, d, generator=g).to(tdt).to(device)
    out, lse = dec.run(q, (k, v), return_lse=True)
    assert isinstance(out, torch.Tensor) and out.device == q.device and out.dtype == tdt
    for b in range(len(kv_lens)):
        want, want_lse = reference(_f64(q[b:b + 1]), *refs[b], causal=True,
                                   sm_scale=1 / math.sqrt(d), soft_cap=30.0)
        _check(out[b:b + 1], want, tol, f"decode {b}")
        _check(lse[b:b + 1], want_lse, 2e-3, f"decode lse {b}")
    qo_lens = [int(rng.integers(1, n + 1)) for n in kv_lens]
    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32)
    pre = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, layout)
    pre.plan(qo_indptr.to(device), indptr, indices, last, hq, hkv, d, page_size, causal=True,
             window_left=37, q_data_type=tdt)
    q = torch.randn(int(qo_indptr[-1]), hq, d, generator=g).to(tdt).to(device)
    out = torch.full_like(q, float("nan"))
    got = pre.run(q, (k, v), out=out)
    assert got is out
    for b in range(len(kv_lens)):
        s, e = int(qo_indptr[b]), int(qo_indptr[b + 1])
        want, _ = reference(_f64(q[s:e]), *refs[b], causal=True, sm_scale=1 / math.sqrt(d),
                            window_left=37)
        _check(out[s:e], want, tol, f"prefill {b}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
def test_decode_fp8_kv_with_scales(rng, device, fp8):
    if not hasattr(torch, fp8):
        pytest.skip(f"torch has no {fp8}")
    fdt = getattr(torch, fp8)
    hq, hkv, d, page_size = 8, 8, 128, 16
    kv_lens = [int(x) for x in rng.integers(1, 200, size=4)]
    k, v, indptr, indices, last, _ = _paged(rng, kv_lens, page_size, hkv, d, torch.float32,
                                            device, "NHD")
    k8, v8 = torch.nan_to_num(k).to(fdt), torch.nan_to_num(v).to(fdt)
    ks, vs = 0.5, 2.0
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=device)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws)
    w.plan(indptr, indices, last, hq, hkv, d, page_size, q_data_type=torch.bfloat16,
           kv_data_type=fdt)
    q = torch.randn(len(kv_lens), hq, d, generator=_gen(rng)).to(torch.bfloat16).to(device)
    out = w.run(q, (k8, v8), k_scale=ks, v_scale=vs)
    kf, vf = _f64(k8) * ks, _f64(v8) * vs
    for b, n in enumerate(kv_lens):
        rows = [int(indices[int(indptr[b]) + t // page_size]) * page_size + t % page_size
                for t in range(n)]
        kb = kf.reshape(-1, hkv, d)[rows]
        vb = vf.reshape(-1, hkv, d)[rows]
        want, _ = reference(_f64(q[b:b + 1]), kb, vb, causal=True, sm_scale=1 / math.sqrt(d))
        _check(out[b:b + 1], want, 6e-2, f"fp8 decode {b}")


@pytest.mark.parametrize("device", DEVICES)
def test_helpers_on_torch(rng, device):
    g = _gen(rng)
    va, vb = torch.randn(9, 4, 32, generator=g), torch.randn(9, 4, 32, generator=g)
    sa, sb = torch.randn(9, 4, generator=g) * 3, torch.randn(9, 4, generator=g) * 3
    v, s = flashinfer.merge_state(va.to(device), sa.to(device), vb.to(device), sb.to(device))
    assert isinstance(v, torch.Tensor) and v.device.type == device
    wa, wb = np.exp2(_f64(sa)), np.exp2(_f64(sb))
    want = (wa[..., None] * _f64(va) + wb[..., None] * _f64(vb)) / (wa + wb)[..., None]
    assert np.allclose(_f64(v), want, atol=1e-5)
    assert np.allclose(_f64(s), np.log2(wa + wb), atol=1e-5)
    x = torch.from_numpy(rng.random(37) < 0.5).to(device)
    assert np.array_equal(flashinfer.packbits(x, "little").cpu().numpy(),
                          np.packbits(x.cpu().numpy(), bitorder="little"))
    b, p = flashinfer.get_batch_indices_positions(
        torch.tensor([0, 1, 3], dtype=torch.int32, device=device),
        torch.tensor([5, 2], dtype=torch.int32, device=device), 3)
    assert b.tolist() == [0, 1, 1] and p.tolist() == [4, 0, 1] and b.device.type == device
