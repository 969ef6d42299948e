"""FlashInfer 0.5's BatchMLAPagedAttentionWrapper on pagoda's MLA path (BatchAttention with
Dqk = head_dim_ckv + head_dim_kpe, Dv = head_dim_ckv, one latent KV head).

Shapes: q_nope [nnz, num_heads, head_dim_ckv], q_pe [nnz, num_heads, head_dim_kpe], ckv_cache
[num_pages, page_size, head_dim_ckv], kpe_cache [num_pages, page_size, head_dim_kpe]; out
[nnz, num_heads, head_dim_ckv] in q's dtype; lse [nnz, num_heads] f32 (base 2, or base e with
return_lse_base_on_e). pagoda's kernels read one latent row [ckv | kpe]: when kpe_cache's rows
follow ckv_cache's in one buffer (SGLang's layout) the cache is viewed without a copy; separate
buffers are concatenated (a copy per run), as are q_nope / q_pe (small)."""
import math

import numpy as np

from pagoda import _arrays as A
from pagoda.flashinfer import _paged as P


class BatchMLAPagedAttentionWrapper:
    def __init__(self, float_workspace_buffer, use_cuda_graph=False, qo_indptr=None,
                 kv_indptr=None, kv_indices=None, kv_len_arr=None, backend="auto"):
        P.check_backend(backend)
        if use_cuda_graph:
            P.unsupported("use_cuda_graph=True", "plan outside and run inside torch.cuda.graph "
                          "capture without it")
        self._float_workspace_buffer = float_workspace_buffer
        self.device = A.device_of(float_workspace_buffer)
        self._plan = None
        self._attns = {}  # one BatchAttention per CUDA stream (host: one)

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        self._float_workspace_buffer = float_workspace_buffer

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv,
             head_dim_kpe, page_size, causal, sm_scale, q_data_type, kv_data_type,
             use_profiler=False):
        """qo_indptr [bs + 1], kv_indptr [bs + 1] (pages), kv_indices [kv_indptr[-1]],
        kv_len_arr [bs] (tokens): int32, read on the host."""
        P.reject_given(use_profiler=use_profiler)
        kv_ptr = P.host_int32(kv_indptr, "kv_indptr")
        kv_len = P.host_int32(kv_len_arr, "kv_len_arr")
        if len(kv_len) != len(kv_ptr) - 1:
            raise ValueError(f"kv_len_arr has {len(kv_len)} entries, kv_indptr implies "
                             f"{len(kv_ptr) - 1}")
        pages = np.diff(kv_ptr)
        if np.any(kv_len > pages * page_size) or \
                np.any((kv_len > 0) & (kv_len <= (pages - 1) * page_size)):
            raise ValueError("kv_len_arr does not match the pages of kv_indptr")
        last = np.where(pages > 0, kv_len - (pages - 1) * page_size, 0).astype(np.int32)
        plan = P.PagedPlan(
            P.attention_for(self._attns, self.device),
            qo_indptr=P.host_int32(qo_indptr, "qo_indptr"), kv_indptr=kv_ptr,
            kv_indices=P.host_int32(kv_indices, "kv_indices"), kv_last_page_len=last,
            page_size=page_size, num_qo_heads=num_heads, num_kv_heads=1,
            head_dim_qk=head_dim_ckv + head_dim_kpe, head_dim_vo=head_dim_ckv,
            q_data_type=q_data_type, kv_data_type=kv_data_type, causal=bool(causal),
            window_left=-1, logits_soft_cap=None, sm_scale=sm_scale, device=self.device)
        P.check_workspace(self._float_workspace_buffer, plan.workspace_bytes(),
                          "BatchMLAPagedAttentionWrapper.plan")
        self._ckv, self._kpe = head_dim_ckv, head_dim_kpe
        self._plan = plan

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse=False,
            profiler_buffer=None, kv_len=None, page_table=None, return_lse_base_on_e=False):
        if self._plan is None:
            raise RuntimeError("BatchMLAPagedAttentionWrapper.run() called before plan()")
        P.reject_given(profiler_buffer=profiler_buffer, kv_len=kv_len, page_table=page_table)
        for name, t, d in (("q_nope", q_nope, self._ckv), ("q_pe", q_pe, self._kpe)):
            P.check_tensor(t, (self._plan.nnz, self._plan.num_qo_heads, d), None, self.device,
                           name)
        for name, t, d in (("ckv_cache", ckv_cache, self._ckv),
                           ("kpe_cache", kpe_cache, self._kpe)):
            if t.ndim != 3 or t.shape[-1] != d:
                raise ValueError(f"{name} must be [num_pages, page_size, {d}], got "
                                 f"{tuple(t.shape)}")
        q = A.joined_last(q_nope, q_pe)
        latent = A.unsqueeze(A.joined_last(ckv_cache, kpe_cache), 2)  # [pages, P, 1, ckv+kpe]
        v = latent[..., : self._ckv]
        res = self._plan.run(q, latent, v, out=out, lse=lse, return_lse=return_lse)
        if return_lse and return_lse_base_on_e:
            out_, lse_ = res
            lse_ *= math.log(2.0)
            return out_, lse_
        return res
