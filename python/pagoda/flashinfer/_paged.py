"""The shared plan/run machinery of pagoda.flashinfer's wrappers over pagoda.BatchAttention.

A wrapper's plan() turns FlashInfer's arguments into one host CSR page table (decode: one query
per request; ragged KV: pages of one token) and plans a pagoda BatchAttention on the workspace
buffer's device ('cpu' backend for host memory, 'cuda' for CUDA memory); run() checks the tensors
against the plan with FlashInfer's exceptions and messages, views an HND cache as NHD (strides
only, no copy), allocates out / lse in the caller's framework when not given, and launches.
"""
import math

import numpy as np

from pagoda import _arrays as A
from pagoda._pagoda import BatchAttention

_LAYOUTS = ("NHD", "HND")
# Backends named by FlashInfer callers that mean "the default kernels".
_AUTO_BACKENDS = ("auto", "fa2", "fa3")


def check_kv_layout(kv_layout):
    if kv_layout not in _LAYOUTS:
        raise KeyError(f"Invalid kv_layout {kv_layout}")


def unsupported(what, why=""):
    raise NotImplementedError(f"pagoda.flashinfer: {what} is not supported by pagoda"
                              + (f" ({why})" if why else ""))


def check_backend(backend):
    if backend not in _AUTO_BACKENDS:
        unsupported(f"backend={backend!r}", "pagoda's own kernels serve 'auto'/'fa2'/'fa3'")


def check_pos_encoding(pos_encoding_mode):
    if pos_encoding_mode != "NONE":
        if pos_encoding_mode not in ("ROPE_LLAMA", "ALIBI"):
            raise KeyError(f"Invalid pos_encoding_mode {pos_encoding_mode}")
        unsupported(f"pos_encoding_mode={pos_encoding_mode!r}",
                    "apply RoPE to q/k before attention")


def reject_given(**kwargs):
    """NotImplementedError for the first argument that is set (not None / False / 0)."""
    for name, value in kwargs.items():
        if value is not None and value is not False and not (isinstance(value, int) and
                                                               not isinstance(value, bool) and
                                                               value == 0):
            unsupported(f"argument {name}")


def backend_for(device, stream=0):
    if device == "cpu":
        return BatchAttention("cpu")
    if device.startswith("cuda"):
        return BatchAttention("cuda", cuda_stream=stream)
    raise ValueError(f"pagoda.flashinfer: unsupported device {device}")


def attention_for(cache, device):
    """The BatchAttention of `device` on its current CUDA stream (created once per stream and
    kept in `cache`); a plan is bound to the stream it was made on."""
    stream = current_stream(device)
    attn = cache.get(stream)
    if attn is None:
        attn = cache[stream] = backend_for(device, stream)
    return attn


def current_stream(device):
    if not device.startswith("cuda"):
        return 0
    import torch
    return torch.cuda.current_stream(torch.device(device)).cuda_stream


def host_int32(x, name):
    a = A.host_numpy(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(a.shape)}")
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name} must be an integer tensor, got {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.int32)


def check_workspace(buf, needed, who):
    nbytes = buf.numel() * buf.element_size() if A.is_torch(buf) else buf.nbytes
    if nbytes < needed:
        raise RuntimeError(f"{who}: float_workspace_buffer too small: {nbytes} bytes, the plan "
                           f"needs {needed}")


def check_tensor(x, shape, dtype_name, device, name):
    got = tuple(x.shape)
    if shape is not None and got != tuple(shape):
        raise ValueError(f"Invalid shape of {name}: expected {tuple(shape)}, got {got}")
    if dtype_name is not None and not A.matches(x, dtype_name):
        raise ValueError(f"Invalid dtype of {name}: expected {dtype_name}, got {A.dtype_name(x)}")
    if device is not None and A.device_of(x) != device:
        raise ValueError(f"Invalid device of {name}: expected {device}, got {A.device_of(x)}")


def unpack_paged_kv_cache(paged_kv_cache, kv_layout):
    """(k, v) NHD views [pages, page_size, Hkv, D] of a (k, v) tuple or a 5-D [pages, 2, ...]."""
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError("paged_kv_cache tuple must be (k_cache, v_cache)")
        k, v = paged_kv_cache
    elif getattr(paged_kv_cache, "ndim", 0) == 5:
        if paged_kv_cache.shape[1] != 2:
            raise ValueError("a 5-D paged_kv_cache must have shape [pages, 2, ...], got "
                             f"{tuple(paged_kv_cache.shape)}")
        k, v = paged_kv_cache[:, 0], paged_kv_cache[:, 1]
    else:
        raise ValueError("paged_kv_cache must be a (k_cache, v_cache) tuple of 4-D tensors or "
                         "one 5-D tensor")
    for name, t in (("k_cache", k), ("v_cache", v)):
        if t.ndim != 4:
            raise ValueError(f"{name} must be 4-D, got shape {tuple(t.shape)}")
    if kv_layout == "HND":
        k, v = A.permute(k, (0, 2, 1, 3)), A.permute(v, (0, 2, 1, 3))
    return k, v


class PagedPlan:
    """One planned step: the host page table and the attention parameters FlashInfer's plan()
    fixes, plus a BatchAttention planned with them."""

    def __init__(self, attn, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, page_size,
                 num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, q_data_type, kv_data_type,
                 causal, window_left, logits_soft_cap, sm_scale, device, packed_mask=None,
                 mask_indptr=None):
        if num_qo_heads <= 0 or num_kv_heads <= 0 or num_qo_heads % num_kv_heads:
            raise ValueError(f"num_qo_heads ({num_qo_heads}) must be a positive multiple of "
                             f"num_kv_heads ({num_kv_heads})")
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        if window_left < -1:
            raise ValueError(f"window_left must be >= -1, got {window_left}")
        self.q_dtype = A.canonical_dtype(q_data_type, "q_data_type")
        self.kv_dtype = A.canonical_dtype(kv_data_type, "kv_data_type") or self.q_dtype
        if self.q_dtype.startswith("fp8"):
            unsupported(f"q_data_type={q_data_type!r}", "fp8 queries")
        self.out_dtype = self.q_dtype
        self.nnz = int(qo_indptr[-1]) if len(qo_indptr) else 0
        self.batch_size = len(qo_indptr) - 1
        self.page_size = page_size
        self.num_qo_heads, self.num_kv_heads = num_qo_heads, num_kv_heads
        self.head_dim_qk, self.head_dim_vo = head_dim_qk, head_dim_vo
        self.causal = causal
        self.window_left = window_left
        self.logits_soft_cap = 0.0 if logits_soft_cap is None else float(logits_soft_cap)
        if self.logits_soft_cap < 0:
            raise ValueError(f"logits_soft_cap must be >= 0, got {logits_soft_cap}")
        self.sm_scale = 1.0 / math.sqrt(head_dim_qk) if sm_scale is None else float(sm_scale)
        self.device = device
        self.stream = current_stream(device)
        self._out_shape = (self.nnz, num_qo_heads, head_dim_vo)
        self._q_np, self._out_np = A.numpy_storage(self.q_dtype), A.numpy_storage(self.out_dtype)
        self._kv_np = A.numpy_storage(self.kv_dtype)
        self._kv_fp8 = self.kv_dtype.startswith("fp8")
        attn.plan(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, page_size, num_qo_heads,
                  num_kv_heads, head_dim_qk, head_dim_vo, self.q_dtype, self.kv_dtype,
                  self.out_dtype, packed_mask, mask_indptr)
        self.attn = attn

    def workspace_bytes(self):
        """Bytes the caller's float workspace must hold: one f32 partial output and LSE per query
        row and head, capped at 8 MiB (pagoda keeps its own scratch; the check keeps undersized
        buffers failing here as they would with FlashInfer, and never asks more than a
        FlashInfer-sized buffer has)."""
        return min(4 * max(self.nnz, 1) * self.num_qo_heads * (self.head_dim_vo + 1), 8 << 20)

    def run(self, q, k, v, *, out, lse, return_lse, q_scale=None, k_scale=None, v_scale=None,
            window_left=None, sinks=None):
        """Allocates what is missing and launches; returns out or (out, lse). k / v are NHD
        views [pages, page_size, Hkv, D]. The C++ run checks every shape, dtype and device
        against the plan before computing; when it refuses, diagnose() names the fault with
        FlashInfer's message (the hot path stays a few microseconds of Python)."""
        if self.stream and current_stream(self.device) != self.stream:
            raise RuntimeError("pagoda.flashinfer: run() on another CUDA stream than plan(); plan "
                               "on the stream you run on (for graph capture: plan under "
                               "torch.cuda.stream(s) and capture with torch.cuda.graph(g, "
                               "stream=s))")
        numpy = type(q) is np.ndarray
        if out is None:
            out = np.empty(self._out_shape, self._out_np) if numpy else \
                A.empty(self._out_shape, self.out_dtype, q)
        if return_lse:
            if lse is None:
                lse = np.empty(self._out_shape[:2], np.float32) if numpy else \
                    A.empty(self._out_shape[:2], "f32", q)
        else:
            lse = None
        if numpy:  # bf16 / fp8 travel as uint16 / uint8 bits: name them, only on those types
            names = (self.q_dtype if q.dtype == self._q_np else "",
                     self.kv_dtype if k.dtype == self._kv_np else "",
                     self.out_dtype if out.dtype == self._out_np else "")
            kk, kv = k, v
        elif self._kv_fp8:
            names = ("", self.kv_dtype if A.matches(k, self.kv_dtype) else "", "")
            kk, kv = A.kernel_array(k), A.kernel_array(v)
        else:
            names, kk, kv = ("", "", ""), k, v
        sinks_host = None
        if sinks is not None:
            sinks_host = A.host_numpy(sinks, np.float32)
            if sinks_host.shape != (self.num_qo_heads,):
                raise ValueError(f"Invalid shape of sinks: expected ({self.num_qo_heads},), got "
                                 f"{tuple(sinks_host.shape)}")
        try:
            self.attn.run(q, kk, kv, out, lse,
                          sm_scale=self.sm_scale if q_scale is None else
                          self.sm_scale * float(q_scale),
                          logits_soft_cap=self.logits_soft_cap,
                          window_left=self.window_left if window_left is None else window_left,
                          causal=self.causal, sinks=sinks_host,
                          k_scale=1.0 if k_scale is None else k_scale,
                          v_scale=1.0 if v_scale is None else v_scale,
                          q_dtype=names[0], kv_dtype=names[1], out_dtype=names[2])
        except ValueError:
            self.diagnose(q, k, v, out, lse)
            raise
        return (out, lse) if return_lse else out

    def diagnose(self, q, k, v, out, lse):
        """Raises FlashInfer's ValueError for the first argument that does not fit the plan
        (returns when it finds none: the caller re-raises pagoda's own error)."""
        hq, hkv = self.num_qo_heads, self.num_kv_heads
        check_tensor(q, (self.nnz, hq, self.head_dim_qk), None, self.device, "q")
        if not A.matches(q, self.q_dtype):
            raise ValueError(f"The dtype of q {A.dtype_name(q)} does not match the q_data_type "
                             f"{self.q_dtype} specified in plan function.")
        if not A.matches(k, self.kv_dtype) or not A.matches(v, self.kv_dtype):
            raise ValueError(f"The dtype of k {A.dtype_name(k)} does not match the kv_data_type "
                             f"{self.kv_dtype} specified in plan function.")
        if tuple(k.shape[1:]) != (self.page_size, hkv, self.head_dim_qk):
            raise ValueError(f"k_cache (NHD view) has shape {tuple(k.shape)}, the plan expects "
                             f"[num_pages, {self.page_size}, {hkv}, {self.head_dim_qk}]")
        if tuple(v.shape) != tuple(k.shape[:3]) + (self.head_dim_vo,):
            raise ValueError(f"v_cache (NHD view) has shape {tuple(v.shape)}, expected "
                             f"{tuple(k.shape[:3]) + (self.head_dim_vo,)}")
        for name, t in (("k_cache", k), ("v_cache", v)):
            check_tensor(t, None, None, self.device, name)
        check_tensor(out, self._out_shape, self.out_dtype, self.device, "out")
        if lse is not None:
            check_tensor(lse, self._out_shape[:2], "f32", self.device, "lse")
