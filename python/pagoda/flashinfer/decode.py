"""FlashInfer 0.5's decode API on pagoda: BatchDecodeWithPagedKVCacheWrapper and
single_decode_with_kv_cache.

Shapes (FlashInfer's): q [batch_size, num_qo_heads, head_dim]; paged_kv_cache a (k_cache, v_cache)
tuple of [max_num_pages, page_size, num_kv_heads, head_dim] (NHD) or
[max_num_pages, num_kv_heads, page_size, head_dim] (HND), or one [max_num_pages, 2, ...] tensor;
out [batch_size, num_qo_heads, head_dim] in q's dtype; lse [batch_size, num_qo_heads] float32,
base 2. dtypes f32 / f16 / bf16 for q, plus fp8 e4m3 / e5m2 for the KV cache (k_scale, v_scale).
"""
import numpy as np

from pagoda import _arrays as A
from pagoda.flashinfer import _paged as P


class BatchDecodeWithPagedKVCacheWrapper:
    """Batch decode (one query per request) over a paged KV cache; plan() once per step, run()
    per layer. use_tensor_cores is accepted and changes nothing (pagoda picks its kernels)."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 use_tensor_cores=False, paged_kv_indptr_buffer=None,
                 paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None):
        P.check_kv_layout(kv_layout)
        P.check_backend(backend)
        if use_cuda_graph:
            P.unsupported("use_cuda_graph=True", "plan outside and run inside torch.cuda.graph "
                          "capture without it")
        P.reject_given(jit_args=jit_args)
        self._kv_layout = kv_layout
        self._float_workspace_buffer = float_workspace_buffer
        self.device = A.device_of(float_workspace_buffer)
        self._use_tensor_cores = use_tensor_cores
        self._plan = None
        self._attns = {}  # one BatchAttention per CUDA stream (host: one)

    @property
    def use_tensor_cores(self):
        return self._use_tensor_cores

    @property
    def is_cuda_graph_enabled(self):
        return False

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        self._float_workspace_buffer = float_workspace_buffer

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
             q_data_type="float16", kv_data_type=None, data_type=None, sm_scale=None,
             rope_scale=None, rope_theta=None, non_blocking=True, block_tables=None,
             seq_lens=None, fixed_split_size=None, disable_split_kv=False):
        """indptr [batch_size + 1], indices [indptr[-1]], last_page_len [batch_size]: int32
        (any device; read on the host). data_type, if given, sets both dtypes (deprecated in
        FlashInfer, still honoured)."""
        P.check_pos_encoding(pos_encoding_mode)
        P.reject_given(block_tables=block_tables, seq_lens=seq_lens,
                       fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv)
        if data_type is not None:
            q_data_type = kv_data_type = data_type
        kv_indptr = P.host_int32(indptr, "indptr")
        bs = len(kv_indptr) - 1
        plan = P.PagedPlan(
            P.attention_for(self._attns, self.device),
            qo_indptr=np.arange(bs + 1, dtype=np.int32), kv_indptr=kv_indptr,
            kv_indices=P.host_int32(indices, "indices"),
            kv_last_page_len=P.host_int32(last_page_len, "last_page_len"), page_size=page_size,
            num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim_qk=head_dim,
            head_dim_vo=head_dim, q_data_type=q_data_type, kv_data_type=kv_data_type,
            causal=True, window_left=window_left, logits_soft_cap=logits_soft_cap,
            sm_scale=sm_scale, device=self.device)
        P.check_workspace(self._float_workspace_buffer, plan.workspace_bytes(),
                          "BatchDecodeWithPagedKVCacheWrapper.plan")
        self._plan = plan

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None,
            q_len_per_req=1):
        """Returns out [batch_size, num_qo_heads, head_dim], or (out, lse) with return_lse.
        window_left overrides the planned window for this call; sinks [num_qo_heads] f32."""
        if self._plan is None:
            raise RuntimeError("BatchDecodeWithPagedKVCacheWrapper.run() called before plan()")
        if args:
            P.unsupported("positional arguments after paged_kv_cache")
        if q_len_per_req not in (None, 1):
            P.unsupported(f"q_len_per_req={q_len_per_req}", "use the prefill wrapper")
        k, v = P.unpack_paged_kv_cache(paged_kv_cache, self._kv_layout)
        return self._plan.run(q, k, v, out=out, lse=lse, return_lse=return_lse,
                              q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                              window_left=window_left, sinks=sinks)

    def forward(self, q, paged_kv_cache, pos_encoding_mode="NONE", q_scale=None, k_scale=None,
                v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None,
                rope_scale=None, rope_theta=None):
        P.unsupported("BatchDecodeWithPagedKVCacheWrapper.forward (deprecated)", "use run()")

    def end_forward(self):
        pass


def single_decode_with_kv_cache(q, k, v, kv_layout="NHD", pos_encoding_mode="NONE",
                                use_tensor_cores=False, q_scale=None, k_scale=None,
                                v_scale=None, window_left=-1, logits_soft_cap=None,
                                sm_scale=None, rope_scale=None, rope_theta=None,
                                return_lse=False):
    """q [num_qo_heads, head_dim]; k, v [kv_len, num_kv_heads, head_dim] (NHD) or
    [num_kv_heads, kv_len, head_dim] (HND). Returns out [num_qo_heads, head_dim] (q's dtype), or
    (out, lse [num_qo_heads] f32) with return_lse."""
    if q.ndim != 2:
        raise ValueError(f"q must be [num_qo_heads, head_dim], got shape {tuple(q.shape)}")
    res = single_attention(A.unsqueeze(q, 0), k, v, kv_layout=kv_layout, causal=False,
                           packed_mask=None, window_left=window_left,
                           logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                           q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                           pos_encoding_mode=pos_encoding_mode, return_lse=return_lse)
    if return_lse:
        return res[0][0], res[1][0]
    return res[0]


_SINGLE = {}  # device -> {stream: BatchAttention} of the single-request functions


def single_attention(q, k, v, *, kv_layout, causal, packed_mask, window_left, logits_soft_cap,
                     sm_scale, q_scale, k_scale, v_scale, pos_encoding_mode, return_lse,
                     o_dtype=None):
    """One request's attention over contiguous k / v (pages of one token); q [qo_len, Hq, D]."""
    P.check_kv_layout(kv_layout)
    P.check_pos_encoding(pos_encoding_mode)
    for name, t in (("k", k), ("v", v)):
        if t.ndim != 3:
            raise ValueError(f"{name} must be 3-D, got shape {tuple(t.shape)}")
    if kv_layout == "HND":
        k, v = A.permute(k, (1, 0, 2)), A.permute(v, (1, 0, 2))
    if tuple(k.shape[:2]) != tuple(v.shape[:2]):
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} disagree on kv_len / heads")
    kv_len = k.shape[0]
    device = A.device_of(q)
    attn = P.attention_for(_SINGLE.setdefault(device, {}), device)
    q_dtype = A.dtype_name(q)
    if o_dtype is not None and A.canonical_dtype(o_dtype, "o_dtype") != q_dtype:
        P.unsupported(f"o_dtype={o_dtype!r} different from q's dtype")
    plan = P.PagedPlan(
        attn, qo_indptr=np.array([0, q.shape[0]], np.int32),
        kv_indptr=np.array([0, kv_len], np.int32), kv_indices=np.arange(kv_len, dtype=np.int32),
        kv_last_page_len=np.array([1 if kv_len else 0], np.int32), page_size=1,
        num_qo_heads=q.shape[1], num_kv_heads=k.shape[1], head_dim_qk=q.shape[2],
        head_dim_vo=v.shape[2], q_data_type=q_dtype,
        kv_data_type=A.dtype_name(k) if A.is_torch(k) or A.dtype_name(k) != "u8" else "fp8_e4m3",
        causal=causal, window_left=window_left, logits_soft_cap=logits_soft_cap,
        sm_scale=sm_scale, device=device, packed_mask=packed_mask,
        mask_indptr=None if packed_mask is None else np.array([0, len(packed_mask)], np.int64))
    return plan.run(q, A.unsqueeze(k, 1), A.unsqueeze(v, 1), out=None, lse=None,
                    return_lse=return_lse, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)
