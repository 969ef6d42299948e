"""FlashInfer 0.5's prefill / append API on pagoda: BatchPrefillWithPagedKVCacheWrapper,
BatchPrefillWithRaggedKVCacheWrapper and single_prefill_with_kv_cache.

Shapes (FlashInfer's): q [qo_indptr[-1], num_qo_heads, head_dim_qk]; paged KV as in decode.py;
ragged k [kv_indptr[-1], num_kv_heads, head_dim_qk] (NHD) or [num_kv_heads, nnz_kv, head_dim]
(HND), v likewise with head_dim_vo; out [nnz_qo, num_qo_heads, head_dim_vo] in q's dtype; lse
[nnz_qo, num_qo_heads] f32, base 2. causal is bottom-right aligned; custom_mask is a flat bool
array (row-major [qo_len, kv_len] per request, concatenated) and packed_custom_mask its
segment_packbits(..., bitorder="little") form; a mask replaces causal, the window still applies.
"""
import numpy as np

from pagoda import _arrays as A
from pagoda.flashinfer import _paged as P
from pagoda.flashinfer.decode import single_attention
from pagoda.flashinfer.quantization import segment_packbits


def _packed_mask(custom_mask, packed_custom_mask, qo_lens, kv_lens):
    """(packed bits, byte mask_indptr int64) on the host, or (None, None) without a mask."""
    bits = qo_lens.astype(np.int64) * kv_lens.astype(np.int64)
    bit_indptr = np.concatenate([[0], np.cumsum(bits)]).astype(np.int64)
    byte_indptr = np.concatenate([[0], np.cumsum((bits + 7) // 8)]).astype(np.int64)
    if custom_mask is not None:
        mask = A.host_numpy(custom_mask).reshape(-1)
        if mask.shape[0] != bit_indptr[-1]:
            raise ValueError(f"custom_mask has {mask.shape[0]} entries, the plan needs "
                             f"sum(qo_len * kv_len) = {bit_indptr[-1]}")
        packed, _ = segment_packbits(mask.astype(bool), bit_indptr, bitorder="little")
        return packed, byte_indptr
    if packed_custom_mask is not None:
        packed = A.host_numpy(packed_custom_mask)
        if packed.dtype != np.uint8 or packed.ndim != 1:
            raise ValueError("packed_custom_mask must be a 1-D uint8 tensor")
        if packed.shape[0] < byte_indptr[-1]:
            raise ValueError(f"packed_custom_mask has {packed.shape[0]} bytes, the plan needs "
                             f"{byte_indptr[-1]}")
        return packed, byte_indptr
    return None, None


def _kv_lens(kv_indptr, last_page_len, page_size):
    pages = np.diff(kv_indptr)
    return np.where(pages > 0, (pages - 1) * page_size + last_page_len, 0)


class _PrefillBase:
    _who = ""

    def __init__(self, float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args,
                 jit_kwargs):
        P.check_kv_layout(kv_layout)
        P.check_backend(backend)
        if use_cuda_graph:
            P.unsupported("use_cuda_graph=True", "plan outside and run inside torch.cuda.graph "
                          "capture without it")
        P.reject_given(jit_args=jit_args, jit_kwargs=jit_kwargs)
        self._kv_layout = kv_layout
        self._float_workspace_buffer = float_workspace_buffer
        self.device = A.device_of(float_workspace_buffer)
        self._plan = None
        self._attns = {}  # one BatchAttention per CUDA stream (host: one)

    @property
    def is_cuda_graph_enabled(self):
        return False

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        self._float_workspace_buffer = float_workspace_buffer

    def end_forward(self):
        pass

    def _make_plan(self, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, page_size,
                   custom_mask, packed_custom_mask, causal, **kw):
        if len(qo_indptr) != len(kv_indptr):
            raise ValueError("The length of qo_indptr and paged_kv_indptr should be the same.")
        kv_lens = _kv_lens(kv_indptr, kv_last_page_len, page_size)
        packed, mask_indptr = _packed_mask(custom_mask, packed_custom_mask, np.diff(qo_indptr),
                                           kv_lens)
        plan = P.PagedPlan(P.attention_for(self._attns, self.device), qo_indptr=qo_indptr,
                           kv_indptr=kv_indptr,
                           kv_indices=kv_indices, kv_last_page_len=kv_last_page_len,
                           page_size=page_size, causal=causal if packed is None else True,
                           packed_mask=packed, mask_indptr=mask_indptr, device=self.device, **kw)
        P.check_workspace(self._float_workspace_buffer, plan.workspace_bytes(),
                          f"{self._who}.plan")
        self._plan = plan

    def _check_planned(self):
        if self._plan is None:
            raise RuntimeError(f"{self._who}.run() called before plan()")


def _common_plan_checks(pos_encoding_mode, use_fp16_qk_reduction, **unsupported_args):
    P.check_pos_encoding(pos_encoding_mode)
    P.reject_given(use_fp16_qk_reduction=use_fp16_qk_reduction, **unsupported_args)


class BatchPrefillWithPagedKVCacheWrapper(_PrefillBase):
    """Batch prefill / append attention over a paged KV cache (plan once per step, run per
    layer)."""
    _who = "BatchPrefillWithPagedKVCacheWrapper"

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf=None, paged_kv_indptr_buf=None, paged_kv_indices_buf=None,
                 paged_kv_last_page_len_buf=None, custom_mask_buf=None, mask_indptr_buf=None,
                 backend="auto", jit_args=None, jit_kwargs=None):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args,
                         jit_kwargs)

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
             rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             non_blocking=True, prefix_len_ptr=None, token_pos_in_items_ptr=None,
             token_pos_in_items_len=0, max_item_len_ptr=None, seq_lens=None, seq_lens_q=None,
             block_tables=None, max_token_per_sequence=None, max_sequence_kv=None,
             fixed_split_size=None, disable_split_kv=False):
        """qo_indptr, paged_kv_indptr [batch_size + 1], paged_kv_indices [paged_kv_indptr[-1]],
        paged_kv_last_page_len [batch_size]: int32 (read on the host)."""
        _common_plan_checks(pos_encoding_mode, use_fp16_qk_reduction,
                            prefix_len_ptr=prefix_len_ptr,
                            token_pos_in_items_ptr=token_pos_in_items_ptr,
                            token_pos_in_items_len=token_pos_in_items_len,
                            max_item_len_ptr=max_item_len_ptr, seq_lens=seq_lens,
                            seq_lens_q=seq_lens_q, block_tables=block_tables,
                            fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv)
        self._make_plan(
            qo_indptr=P.host_int32(qo_indptr, "qo_indptr"),
            kv_indptr=P.host_int32(paged_kv_indptr, "paged_kv_indptr"),
            kv_indices=P.host_int32(paged_kv_indices, "paged_kv_indices"),
            kv_last_page_len=P.host_int32(paged_kv_last_page_len, "paged_kv_last_page_len"),
            page_size=page_size, custom_mask=custom_mask, packed_custom_mask=packed_custom_mask,
            causal=causal, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
            head_dim_qk=head_dim_qk, head_dim_vo=head_dim_vo or head_dim_qk,
            q_data_type=q_data_type, kv_data_type=kv_data_type, window_left=window_left,
            logits_soft_cap=logits_soft_cap, sm_scale=sm_scale)

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None):
        """Returns out [nnz_qo, num_qo_heads, head_dim_vo], or (out, lse) with return_lse."""
        self._check_planned()
        if args:
            P.unsupported("positional arguments after paged_kv_cache")
        k, v = P.unpack_paged_kv_cache(paged_kv_cache, self._kv_layout)
        return self._plan.run(q, k, v, out=out, lse=lse, return_lse=return_lse,
                              q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                              window_left=window_left, sinks=sinks)


class BatchPrefillWithRaggedKVCacheWrapper(_PrefillBase):
    """Batch prefill attention over ragged (contiguous per request) K / V; pagoda views them as
    pages of one token, without a copy."""
    _who = "BatchPrefillWithRaggedKVCacheWrapper"

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf=None, kv_indptr_buf=None, custom_mask_buf=None,
                 mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args,
                         jit_kwargs)

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk,
             head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False,
             pos_encoding_mode="NONE", use_fp16_qk_reduction=False, window_left=-1,
             logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None, non_blocking=True, prefix_len_ptr=None,
             token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None,
             fixed_split_size=None, disable_split_kv=False):
        """qo_indptr, kv_indptr [batch_size + 1] int32 (read on the host)."""
        _common_plan_checks(pos_encoding_mode, use_fp16_qk_reduction,
                            prefix_len_ptr=prefix_len_ptr,
                            token_pos_in_items_ptr=token_pos_in_items_ptr,
                            token_pos_in_items_len=token_pos_in_items_len,
                            max_item_len_ptr=max_item_len_ptr, fixed_split_size=fixed_split_size,
                            disable_split_kv=disable_split_kv)
        kv = P.host_int32(kv_indptr, "kv_indptr")
        if len(kv) == 0 or np.any(np.diff(kv) < 0):
            raise ValueError("kv_indptr must be non-empty and non-decreasing")
        self._nnz_kv = int(kv[-1])
        self._make_plan(
            qo_indptr=P.host_int32(qo_indptr, "qo_indptr"), kv_indptr=kv - kv[0],
            kv_indices=np.arange(kv[0], kv[-1], dtype=np.int32),
            kv_last_page_len=(np.diff(kv) > 0).astype(np.int32), page_size=1,
            custom_mask=custom_mask, packed_custom_mask=packed_custom_mask, causal=causal,
            num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim_qk=head_dim_qk,
            head_dim_vo=head_dim_vo or head_dim_qk, q_data_type=q_data_type,
            kv_data_type=kv_data_type, window_left=window_left, logits_soft_cap=logits_soft_cap,
            sm_scale=sm_scale)

    begin_forward = plan

    def run(self, q, k, v, *args, out=None, lse=None, return_lse=False, enable_pdl=None):
        """k [nnz_kv, num_kv_heads, head_dim_qk], v [nnz_kv, num_kv_heads, head_dim_vo] (NHD).
        Returns out [nnz_qo, num_qo_heads, head_dim_vo], or (out, lse) with return_lse."""
        self._check_planned()
        if args:
            P.unsupported("positional arguments after v")
        for name, t in (("k", k), ("v", v)):
            if t.ndim != 3:
                raise ValueError(f"{name} must be 3-D, got shape {tuple(t.shape)}")
        if self._kv_layout == "HND":
            k, v = A.permute(k, (1, 0, 2)), A.permute(v, (1, 0, 2))
        if k.shape[0] < self._nnz_kv or v.shape[0] < self._nnz_kv:
            raise ValueError(f"k / v have {k.shape[0]} / {v.shape[0]} rows, kv_indptr[-1] is "
                             f"{self._nnz_kv}")
        return self._plan.run(q, A.unsqueeze(k, 1), A.unsqueeze(v, 1), out=out, lse=lse,
                              return_lse=return_lse)


def single_prefill_with_kv_cache(q, k, v, scale_q=None, scale_k=None, scale_v=None,
                                 o_dtype=None, custom_mask=None, packed_custom_mask=None,
                                 causal=False, kv_layout="NHD", pos_encoding_mode="NONE",
                                 use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
                                 logits_soft_cap=None, rope_scale=None, rope_theta=None,
                                 backend="auto", return_lse=False):
    """q [qo_len, num_qo_heads, head_dim_qk]; k, v [kv_len, num_kv_heads, head_dim] (NHD) or
    [num_kv_heads, kv_len, head_dim] (HND); custom_mask bool [qo_len, kv_len] or
    packed_custom_mask uint8 (little bit order). Returns out [qo_len, num_qo_heads, head_dim_vo],
    or (out, lse [qo_len, num_qo_heads] f32) with return_lse."""
    P.check_backend(backend)
    P.reject_given(scale_q=scale_q, scale_k=scale_k, scale_v=scale_v,
                   use_fp16_qk_reduction=use_fp16_qk_reduction)
    if q.ndim != 3:
        raise ValueError(f"q must be [qo_len, num_qo_heads, head_dim], got {tuple(q.shape)}")
    kv_len = k.shape[1] if kv_layout == "HND" else k.shape[0]
    packed, _ = _packed_mask(custom_mask, packed_custom_mask, np.array([q.shape[0]]),
                             np.array([kv_len]))
    return single_attention(q, k, v, kv_layout=kv_layout, causal=causal if packed is None else True,
                            packed_mask=packed, window_left=window_left,
                            logits_soft_cap=logits_soft_cap, sm_scale=sm_scale, q_scale=None,
                            k_scale=None, v_scale=None, pos_encoding_mode=pos_encoding_mode,
                            return_lse=return_lse, o_dtype=o_dtype)
