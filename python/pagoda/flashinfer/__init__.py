"""pagoda.flashinfer: FlashInfer 0.5's paged-attention API on pagoda's kernels.

    import pagoda.flashinfer as flashinfer

runs code written for FlashInfer unchanged where it uses the names below (same class, function and
argument names, defaults, shapes, NHD / HND layouts, plan() / run() split, return_lse, errors).
What pagoda cannot do raises NotImplementedError naming it. Tensors: NumPy arrays (CPU) or torch
tensors (CPU, CUDA); the workspace buffer's device picks pagoda's CPU or CUDA kernels.
LSE is base 2, as FlashInfer's. See docs/python.md for the covered and missing API.
"""
from pagoda.flashinfer.cascade import merge_state, merge_state_in_place, merge_states
from pagoda.flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper, single_decode_with_kv_cache
from pagoda.flashinfer.mla import BatchMLAPagedAttentionWrapper
from pagoda.flashinfer.page import append_paged_kv_cache, get_batch_indices_positions
from pagoda.flashinfer.prefill import (BatchPrefillWithPagedKVCacheWrapper,
                                       BatchPrefillWithRaggedKVCacheWrapper,
                                       single_prefill_with_kv_cache)
from pagoda.flashinfer.quantization import packbits, segment_packbits
from pagoda.flashinfer.sampling import (min_p_sampling_from_probs, sampling_from_logits,
                                        sampling_from_probs, top_k_sampling_from_probs,
                                        top_k_top_p_sampling_from_logits,
                                        top_k_top_p_sampling_from_probs, top_p_sampling_from_probs)

__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper", "BatchMLAPagedAttentionWrapper",
    "single_decode_with_kv_cache",
    "single_prefill_with_kv_cache", "merge_state", "merge_state_in_place", "merge_states",
    "append_paged_kv_cache", "get_batch_indices_positions", "packbits", "segment_packbits",
    "sampling_from_logits", "sampling_from_probs", "top_p_sampling_from_probs",
    "top_k_sampling_from_probs", "min_p_sampling_from_probs", "top_k_top_p_sampling_from_logits",
    "top_k_top_p_sampling_from_probs",
]
